"""Every dialect of the simulated engine over real loopback HTTP: wire shapes, token counts,
timing against the engine's schedule, cancellation, faults and ``--dialect`` filtering.

Each dialect is only a renderer over the same engine, so the same schedule must show through
every one of them; the bounds are those of tests/unit/sim/test_engine.py (never early, a
little late).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from openai.types.responses import ResponseCompletedEvent, ResponseTextDeltaEvent

from llmobs.config.settings import ConfigError
from llmobs.sim import SimSettings
from llmobs.sim.config import SIM_DIALECTS
from llmobs.sim.dialects import DIALECTS
from tests.support.servers import SimFactory, eventually
from tests.support.sim import assert_near, assert_on_schedule, gaps

FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
# prefill 100 ms, then one token every 20 ms, one request at a time
SCHEDULE: dict[str, Any] = {
    "max_batch": 1, "prefill_base": 0.1, "prefill_per_token": 0.0, "decode_base": 0.02,
    "decode_per_seq": 0.0,
}  # fmt: skip
MESSAGES = [{"role": "user", "content": "Say something."}]  # 14 characters: 4 prompt tokens
WORD = re.compile(r" [a-z]+")
ASSISTANT = {"role": "assistant", "content": ""}

# One streaming request per dialect, each on its native path.
STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
    ),
    "ollama": ("/api/chat", {"model": "m", "messages": MESSAGES}),  # streams by default
    "tgi": ("/generate_stream", {"inputs": "Say something.", "parameters": {"details": True}}),
    "anthropic": ("/v1/messages", {"max_tokens": 999, "messages": MESSAGES, "stream": True}),
    "responses": ("/v1/responses", {"input": "Say something.", "stream": True}),
    "triton": (
        "/v2/models/ensemble/generate_stream",
        {"text_input": "Say something.", "return_num_output_tokens": True},
    ),
}
# A valid non-streamed body for every route, for the routing tests.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MESSAGES},
    "/v1/completions": {"prompt": "hi"},
    "/api/generate": {"prompt": "hi", "stream": False},
    "/api/chat": {"messages": MESSAGES, "stream": False},
    "/generate_stream": {"inputs": "hi"},
    "/generate": {"inputs": "hi"},
    "/": {"inputs": "hi"},
    "/v1/messages": {"max_tokens": 9, "messages": MESSAGES},
    "/v1/responses": {"input": "hi"},
    "/v2/models/{model}/generate_stream": {"text_input": "hi"},
    "/v2/models/{model}/generate": {"text_input": "hi"},
    "/v2/models/{model}/versions/{version:[0-9]+}/generate_stream": {"text_input": "hi"},
    "/v2/models/{model}/versions/{version:[0-9]+}/generate": {"text_input": "hi"},
}


def url_of(route: str) -> str:
    """A path the route answers (Triton's name their model and version)."""
    return route.replace("{model}", "m").replace("{version:[0-9]+}", "2")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@dataclass
class Frame:
    """One SSE event or NDJSON line, and when it arrived (seconds since the request)."""

    at: float
    event: str | None
    data: Any
    raw: bytes


async def collect(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], limit: int = 10_000
) -> list[Frame]:
    """POST and read the answer frame by frame: NDJSON lines or SSE events, by Content-Type.

    After ``limit`` frames the connection is closed, as a client that goes away does.
    """
    loop = asyncio.get_running_loop()
    sent = loop.time()
    frames: list[Frame] = []
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        ndjson = resp.headers["Content-Type"] == "application/x-ndjson"
        while len(frames) < limit:
            raw = await (resp.content.readline() if ndjson else resp.content.readuntil(b"\n\n"))
            if not raw:
                break
            frames.append(_frame(loop.time() - sent, raw, ndjson))
        if len(frames) >= limit:
            resp.close()
    return frames


def _frame(at: float, raw: bytes, ndjson: bool) -> Frame:
    if ndjson:
        assert raw.endswith(b"\n")
        return Frame(at, None, json.loads(raw), raw)
    assert raw.endswith(b"\n\n")
    event, data = None, None
    for line in raw[:-2].decode().split("\n"):
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        else:
            assert line.startswith("data:"), raw
            data = line.removeprefix("data:").removeprefix(" ")
    assert data is not None
    return Frame(at, event, data if data == "[DONE]" else json.loads(data), raw)


def token_frames(dialect: str, frames: list[Frame]) -> list[Frame]:
    """The frames of a stream that carry generated tokens, in each dialect's terms."""
    keep: dict[str, Callable[[Frame], bool]] = {
        "openai": lambda f: (
            f.data != "[DONE]"
            and bool(f.data["choices"])
            and "role" not in f.data["choices"][0]["delta"]
        ),
        "ollama": lambda f: not f.data["done"],
        "tgi": lambda f: True,
        "anthropic": lambda f: f.event == "content_block_delta",
        "responses": lambda f: f.event == "response.output_text.delta",
        "triton": lambda f: True,
    }
    return [f for f in frames if keep[dialect](f)]


def token_text(dialect: str, frame: Frame) -> str:
    data = frame.data
    texts: dict[str, Callable[[], str]] = {
        "openai": lambda: data["choices"][0]["delta"]["content"],
        "ollama": lambda: data["message"]["content"],
        "tgi": lambda: data["token"]["text"],
        "anthropic": lambda: data["delta"]["text"],
        "responses": lambda: data["delta"],
        "triton": lambda: data["text_output"],
    }
    return texts[dialect]()


def reported_tokens(dialect: str, frames: list[Frame]) -> int:
    """The output token count a stream reports at its end, in each dialect's terms."""
    counts: dict[str, Callable[[], int]] = {
        "openai": lambda: frames[-2].data["usage"]["completion_tokens"],
        "ollama": lambda: frames[-1].data["eval_count"],
        "tgi": lambda: frames[-1].data["details"]["generated_tokens"] - 1,  # less the EOS
        "anthropic": lambda: frames[-2].data["usage"]["output_tokens"],
        "responses": lambda: frames[-1].data["response"]["usage"]["output_tokens"],
        "triton": lambda: sum(f.data["num_output_tokens"] for f in frames),
    }
    return counts[dialect]()


# --- Ollama ---------------------------------------------------------------------------------


async def test_ollama_generate_streams_ndjson_with_counters(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=12, output_tokens_max=12, tokens_per_chunk=2)
    body = {"model": "llama3", "prompt": "x" * 9, "options": {"seed": 3}}
    frames = await collect(http, sim.url + "/api/generate", body)

    *lines, final = [f.data for f in frames]
    assert [len(line["response"].split()) for line in lines] == [1, 2, 2, 2, 2, 2, 1]
    for line in lines:
        assert list(line) == ["model", "created_at", "response", "done"]
        assert line["model"] == "llama3"
        assert line["done"] is False
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line["created_at"])
    assert final["response"] == ""
    assert final["done"] is True
    assert final["done_reason"] == "stop"
    assert final["eval_count"] == 12 == len("".join(t["response"] for t in lines).split())
    assert final["prompt_eval_count"] == 3
    assert len(final["context"]) == 12
    assert all(isinstance(i, int) for i in final["context"])
    assert final["load_duration"] == 5_000_000
    parts = ("load_duration", "prompt_eval_duration", "eval_duration")
    assert final["total_duration"] == sum(final[p] for p in parts)

    async with http.post(sim.url + "/api/generate", json={**body, "stream": False}) as resp:
        assert resp.content_type == "application/json"
        whole = await resp.json()
    assert whole["response"] == "".join(t["response"] for t in lines)  # the same seed
    assert (whole["done"], whole["done_reason"], whole["eval_count"]) == (True, "stop", 12)


async def test_ollama_chat_and_num_predict(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=12, output_tokens_max=12)
    body = {"model": "m", "messages": MESSAGES, "options": {"num_predict": 5}}
    frames = await collect(http, sim.url + "/api/chat", body)

    *lines, final = [f.data for f in frames]
    assert len(lines) == 5
    assert all(line["message"]["role"] == "assistant" for line in lines)
    assert all(WORD.fullmatch(line["message"]["content"]) for line in lines)
    assert final["message"] == {"role": "assistant", "content": ""}
    assert (final["done_reason"], final["eval_count"], final["prompt_eval_count"]) == (
        "length",
        5,
        4,
    )
    assert "context" not in final  # /api/chat carries no context, as in Ollama

    async with http.post(sim.url + "/api/chat", json={**body, "stream": False}) as resp:
        whole = await resp.json()
    assert len(whole["message"]["content"].split()) == whole["eval_count"] == 5


# --- TGI ------------------------------------------------------------------------------------


async def test_tgi_streams_one_token_per_event_and_ends_with_eos(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=7, output_tokens_max=7, tokens_per_chunk=3)
    body = {"inputs": "x" * 9, "parameters": {"details": True, "seed": 11}}
    frames = await collect(http, sim.url + "/generate_stream", body)

    assert all(f.raw.startswith(b'data:{"index":') for f in frames)  # no space, as TGI
    events = [f.data for f in frames]
    assert [e["index"] for e in events] == list(range(1, 9))  # tokens_per_chunk ignored
    words, eos = events[:-1], events[-1]
    assert all(WORD.fullmatch(e["token"]["text"]) and not e["token"]["special"] for e in words)
    assert all(e["generated_text"] is None and e["details"] is None for e in words)
    assert eos["token"] == {"id": 2, "text": "</s>", "logprob": 0.0, "special": True}
    assert eos["generated_text"] == "".join(e["token"]["text"] for e in words)
    assert eos["details"] == {
        "finish_reason": "eos_token",
        "generated_tokens": 8,  # 7 words and the EOS token
        "seed": 11,
        "input_length": 3,
    }

    capped = {"inputs": "hi", "parameters": {"max_new_tokens": 4}}
    events = [f.data for f in await collect(http, sim.url + "/generate_stream", capped)]
    assert len(events) == 4
    assert not any(e["token"]["special"] for e in events)
    assert events[-1]["details"] is None  # details only when asked for, as TGI does
    assert len(events[-1]["generated_text"].split()) == 4


async def test_tgi_generate_with_and_without_details(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=6, output_tokens_max=6)
    async with http.post(sim.url + "/generate", json={"inputs": "hi"}) as resp:
        plain = await resp.json()
    body = {"inputs": "hi", "parameters": {"details": True, "max_new_tokens": 6}}
    async with http.post(sim.url + "/generate", json=body) as resp:
        detailed = await resp.json()
    async with http.post(sim.url + "/generate", json={"parameters": {}}) as resp:
        assert resp.status == 422
        error = await resp.json()
    # POST / (huggingface_hub's InferenceClient): the body's ``stream`` picks the route.
    async with http.post(sim.url + "/", json={"inputs": "hi"}) as resp:
        compat = await resp.json()
    streamed = await collect(http, sim.url + "/", {"inputs": "hi", "stream": True})

    assert list(plain) == ["generated_text"]
    assert len(plain["generated_text"].split()) == 6
    details = detailed["details"]
    # 6 words would need a 7th step for EOS: max_new_tokens=6 ends the output by length.
    assert (details["finish_reason"], details["generated_tokens"]) == ("length", 6)
    assert details["prefill"] == []
    assert "".join(t["text"] for t in details["tokens"]) == detailed["generated_text"]
    assert error["error_type"] == "validation"
    assert "inputs" in error["error"]
    assert [list(c) for c in compat] == [["generated_text"]]
    assert [f.data["index"] for f in streamed] == list(range(1, 8))  # 6 words and EOS


# --- Anthropic ------------------------------------------------------------------------------


async def test_anthropic_stream_is_the_documented_sequence(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=9, output_tokens_max=9, tokens_per_chunk=3)
    body = {"model": "claude-x", "max_tokens": 100, "messages": MESSAGES, "stream": True}
    frames = await collect(http, sim.url + "/v1/messages", body)

    names = [f.event for f in frames]
    deltas = ["content_block_delta"] * 4  # 1, 3, 3, 2 tokens
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(f.data["type"] == f.event for f in frames)
    assert frames[2].raw == b'event: ping\ndata: {"type": "ping"}\n\n'
    start = frames[0].data["message"]
    assert start["id"].startswith("msg_")
    assert (start["model"], start["role"], start["content"]) == ("claude-x", "assistant", [])
    assert start["usage"] == {"input_tokens": 4, "output_tokens": 1}
    assert frames[1].data["content_block"] == {"type": "text", "text": ""}
    texts = [f.data["delta"]["text"] for f in frames[3:7]]
    assert [len(t.split()) for t in texts] == [1, 3, 3, 2]
    assert all(f.data["delta"]["type"] == "text_delta" for f in frames[3:7])
    assert frames[-2].data["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert frames[-2].data["usage"] == {"output_tokens": 9}


async def test_anthropic_non_streaming_and_errors(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=9, output_tokens_max=9)
    body: dict[str, Any] = {"max_tokens": 4, "messages": MESSAGES, "system": "Be brief."}
    async with http.post(sim.url + "/v1/messages", json=body) as resp:
        message = await resp.json()
    async with http.post(sim.url + "/v1/messages", json={"messages": MESSAGES}) as resp:
        assert resp.status == 400
        error = await resp.json()

    assert message["type"] == "message"
    assert message["stop_reason"] == "max_tokens"
    assert message["stop_sequence"] is None
    assert len(message["content"][0]["text"].split()) == 4
    assert message["usage"] == {"input_tokens": 6, "output_tokens": 4}  # system counts too
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in error["error"]["message"]


# --- OpenAI Responses -----------------------------------------------------------------------


async def test_responses_stream_events_and_sequence_numbers(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=6, output_tokens_max=6)
    frames = await collect(http, sim.url + "/v1/responses", STREAMS["responses"][1])

    assert [f.event for f in frames] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 6,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [f.data["sequence_number"] for f in frames] == list(range(len(frames)))
    assert all(f.data["type"] == f.event for f in frames)
    item_id = frames[2].data["item"]["id"]
    deltas = [f.data for f in frames[4:10]]
    assert all(
        d["item_id"] == item_id and d["output_index"] == d["content_index"] == 0 for d in deltas
    )
    text = "".join(d["delta"] for d in deltas)
    assert frames[10].data["text"] == text
    done = frames[-1].data["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0] == {
        "type": "output_text",
        "text": text,
        "annotations": [],
    }
    assert done["usage"] == {
        "input_tokens": 4,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 10,
    }


async def test_responses_capped_is_incomplete_and_the_sdk_reads_it(start_sim: SimFactory) -> None:
    sim = await start_sim(**FAST, output_tokens_min=6, output_tokens_max=6)
    async with AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as client:
        events = [
            event
            async for event in await client.responses.create(
                model="m", input=[{"role": "user", "content": "hello"}], stream=True
            )
        ]
        capped = await client.responses.create(model="m", input="hello", max_output_tokens=3)

    deltas = [e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) == 6
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert events[-1].response.output_text == "".join(deltas)
    assert capped.status == "incomplete"
    assert capped.incomplete_details is not None
    assert capped.incomplete_details.reason == "max_output_tokens"
    assert capped.usage is not None
    assert capped.usage.output_tokens == 3 == len(capped.output_text.split())


# --- OpenAI chat extras ---------------------------------------------------------------------


async def test_n_choices_interleave_one_chunk_per_step(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    schedule = {**SCHEDULE, "max_batch": 2, "prefill_base": 0.05}
    sim = await start_sim(**schedule, output_tokens_min=6, output_tokens_max=12)
    body = {"messages": MESSAGES, "stream": True, "n": 2, "seed": 5}
    body["stream_options"] = {"include_usage": True}
    frames = await collect(http, sim.url + "/v1/chat/completions", body)

    chunks = [f.data for f in frames[:-1]]
    roles = [c["choices"][0] for c in chunks[:2]]
    assert [(r["index"], r["delta"]) for r in roles] == [(i, ASSISTANT) for i in (0, 1)]
    content = token_frames("openai", frames)
    order = [f.data["choices"][0]["index"] for f in content]
    words = [order.count(0), order.count(1)]
    both = 2 * min(words)
    assert order[:both] == [0, 1] * min(words)  # one chunk per choice per step
    finishes = [f.data["choices"][0] for f in content if f.data["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in finishes) == [0, 1]
    pairs = [content[i : i + 2] for i in range(0, both, 2)]
    assert all(abs(b.at - a.at) < 0.005 for a, b in pairs)  # same step, same moment
    # Two sequences are prefilled in one step (0.05 s each), then decode together.
    assert_on_schedule([a.at for a, _ in pairs], [0.1 + 0.02 * i for i in range(len(pairs))])
    assert chunks[-1]["usage"]["completion_tokens"] == sum(words)
    assert chunks[-1]["usage"]["prompt_tokens"] == 4

    # Choice 0 is what a plain request with the same seed generates; choice 1 differs.
    single = {"messages": MESSAGES, "seed": 5}
    async with http.post(sim.url + "/v1/chat/completions", json={**single, "n": 2}) as resp:
        pair = await resp.json()
    async with http.post(sim.url + "/v1/chat/completions", json=single) as resp:
        alone = await resp.json()
    texts = [c["message"]["content"] for c in pair["choices"]]
    assert [c["index"] for c in pair["choices"]] == [0, 1]
    assert texts[0] == alone["choices"][0]["message"]["content"] != texts[1]
    streamed = ["", ""]
    for frame in content:
        streamed[frame.data["choices"][0]["index"]] += token_text("openai", frame)
    assert streamed == texts
    assert pair["usage"]["completion_tokens"] == sum(len(t.split()) for t in texts)


async def test_reasoning_effort_splits_reasoning_and_content(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=12, output_tokens_max=12, tokens_per_chunk=2)
    body = {"messages": MESSAGES, "stream": True, "reasoning_effort": "low", "seed": 1}
    body["stream_options"] = {"include_usage": True}
    frames = await collect(http, sim.url + "/v1/chat/completions", body)

    deltas = [f.data["choices"][0]["delta"] for f in frames[1:-2]]
    # chunks of 1, 2, 2, 2, 2, 2, 1 tokens; the first 4 of 12 are reasoning
    assert [sorted(d) for d in deltas] == [
        ["reasoning_content"],
        ["reasoning_content"],
        ["content", "reasoning_content"],
        *[["content"]] * 4,
    ]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    assert (len(reasoning.split()), len(content.split())) == (4, 8)
    usage = frames[-2].data["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 4}

    plain = {"messages": MESSAGES, "reasoning_effort": None, "seed": 1}
    async with http.post(sim.url + "/v1/chat/completions", json=plain) as resp:
        whole = await resp.json()
    message = whole["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


# --- Every dialect --------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", list(STREAMS))
async def test_timing_follows_the_schedule_in_every_dialect(
    start_sim: SimFactory, http: aiohttp.ClientSession, dialect: str
) -> None:
    sim = await start_sim(**SCHEDULE, output_tokens_min=15, output_tokens_max=15)
    path, body = STREAMS[dialect]
    frames = await collect(http, sim.url + path, body)

    tokens = token_frames(dialect, frames)
    count = 16 if dialect == "tgi" else 15  # TGI's EOS takes a decode step of its own
    assert len(tokens) == count
    text = "".join(token_text(dialect, f) for f in tokens).removesuffix("</s>")
    assert len(text.split()) == 15 == reported_tokens(dialect, frames)
    times = [f.at for f in tokens]
    assert_on_schedule(times, [0.1 + 0.02 * i for i in range(count)])
    assert_near(times[0], 0.1)  # TTFT: one prefill step
    assert_near(sorted(gaps(times))[len(times) // 2], 0.02)  # ITL: one decode step
    # Anthropic and Responses open the stream on acceptance, before prefill ends.
    preamble = [f.event for f in frames if f.at < times[0] - 0.05]
    assert len(preamble) == {"anthropic": 3, "responses": 2}.get(dialect, 0), preamble
    if dialect == "ollama":
        final = frames[-1].data
        assert abs(final["prompt_eval_duration"] - 100_000_000) <= 1_000
        assert abs(final["eval_duration"] - 14 * 20_000_000) <= 1_000


@pytest.mark.parametrize("dialect", [*STREAMS, "openai-n2"])
async def test_disconnect_cancels_in_the_engine(
    start_sim: SimFactory, http: aiohttp.ClientSession, dialect: str
) -> None:
    sim = await start_sim(
        **{**FAST, "decode_base": 0.01}, output_tokens_min=300, output_tokens_max=300
    )
    path, body = STREAMS[dialect.removesuffix("-n2")]
    choices = 2 if dialect.endswith("-n2") else 1
    extra = {"n": choices} if choices > 1 else {}
    await collect(http, sim.url + path, {**body, **extra}, limit=6)

    await eventually(lambda: sim.engine.counters.cancelled == choices)
    counters = sim.engine.counters
    assert (counters.running, counters.waiting, counters.completed) == (0, 0, 0)
    assert counters.generation_tokens < 50


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_dialect_setting_serves_only_its_routes(
    start_sim: SimFactory, http: aiohttp.ClientSession, dialect: str
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=2, output_tokens_max=2, dialect=dialect)
    own = {e.path for e in DIALECTS[dialect]}
    assert set(BODIES) == {e.path for endpoints in DIALECTS.values() for e in endpoints}
    for path, body in BODIES.items():
        async with http.post(sim.url + url_of(path), json=body) as resp:
            await resp.read()
            assert resp.status == (200 if path in own else 404), (path, resp.status)
    for path in ("/health", "/v1/models", "/metrics"):
        async with http.get(sim.url + path) as resp:
            assert resp.status == 200


@pytest.mark.parametrize(
    ("dialect", "check"),
    [
        ("openai", lambda e: e["error"]["type"] == "internal_server_error"),
        ("ollama", lambda e: e == {"error": "simulated engine failure"}),
        ("tgi", lambda e: e["error_type"] == "generation"),
        ("anthropic", lambda e: e["type"] == "error" and e["error"]["type"] == "api_error"),
        ("responses", lambda e: e["error"]["code"] == 500),
        ("triton", lambda e: e == {"error": "simulated engine failure"}),
    ],
)
async def test_error_rate_answers_500_in_each_dialect(
    start_sim: SimFactory,
    http: aiohttp.ClientSession,
    dialect: str,
    check: Callable[[Any], bool],
) -> None:
    sim = await start_sim(**FAST, error_rate=1.0)
    path, body = STREAMS[dialect]
    async with http.post(sim.url + path, json=body) as resp:
        assert resp.status == 500
        assert check(await resp.json())
    assert sim.engine.counters.errors == 1


async def test_one_engine_one_output_whatever_the_dialect(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST)
    requests: dict[str, tuple[dict[str, Any], Callable[[Any], str]]] = {
        "/v1/completions": ({"prompt": "hi", "seed": 9}, lambda r: r["choices"][0]["text"]),
        "/api/generate": (
            {"prompt": "hi", "stream": False, "options": {"seed": 9}},
            lambda r: r["response"],
        ),
        "/generate": ({"inputs": "hi", "parameters": {"seed": 9}}, lambda r: r["generated_text"]),
    }
    texts = []
    for path, (body, text) in requests.items():
        async with http.post(sim.url + path, json=body) as resp:
            texts.append(text(await resp.json()))
    assert len(set(texts)) == 1
    assert len(texts[0].split()) >= 32


def test_dialect_setting_from_flags_and_environment() -> None:
    assert SimSettings.from_sources({"LLMOBS_SIM_DIALECT": " TGI "}).dialect == "tgi"
    assert SimSettings().dialect == "all"
    with pytest.raises(ConfigError, match="LLMOBS_SIM_DIALECT"):
        SimSettings.from_sources({"LLMOBS_SIM_DIALECT": "grpc"})
    assert ("all", *DIALECTS) == SIM_DIALECTS


# --- Triton ---------------------------------------------------------------------------------


async def test_triton_names_the_model_of_its_path_and_counts_when_asked(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=7, output_tokens_max=7, tokens_per_chunk=3)
    body = {"text_input": "Say something.", "max_tokens": 7, "return_num_input_tokens": True,
            "return_num_output_tokens": True}  # fmt: skip
    url = sim.url + "/v2/models/ensemble/versions/3/generate_stream"
    async with http.post(url, json=body) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        raw = await resp.read()
    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e]
    assert raw.startswith(b"data: {") and b"[DONE]" not in raw
    assert {(e["model_name"], e["model_version"]) for e in events} == {("ensemble", "3")}
    # the first token alone, then tokens_per_chunk per response, each counted
    assert [e["num_output_tokens"] for e in events] == [1, 3, 3]
    assert {e["num_input_tokens"] for e in events} == {4}
    # /generate answers once, the prompt before the output unless told not to
    async with http.post(sim.url + "/v2/models/m/generate", json=body) as resp:
        whole = await resp.json()
    assert whole["text_output"].startswith("Say something.")
    assert whole["num_output_tokens"] == 7
    no_echo = {**body, "parameters": {"exclude_input_in_output": True}}
    async with http.post(sim.url + "/v2/models/m/generate", json=no_echo) as resp:
        assert not (await resp.json())["text_output"].startswith("Say")
    async with http.post(sim.url + "/v2/models/m/generate", json={"max_tokens": 3}) as resp:
        assert resp.status == 400
        assert "text_input" in (await resp.json())["error"]
