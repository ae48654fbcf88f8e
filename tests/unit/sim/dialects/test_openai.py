"""OpenAI chat and text completions as the sim writes them (``sim.dialects.openai``), in
vLLM's shapes, since the sidecar must read real vLLM streams: the role chunk, ``finish_reason``
on the last token's chunk, the usage chunk and ``[DONE]``; ``n`` choices interleaved a chunk
per step; ``reasoning_effort``'s first third as ``reasoning_content``; vLLM's per-request
``metrics``; the send-time stamp in the token text; and the OpenAI SDK reading all of it.

The renderer is driven directly with literal sequences (exact bytes), and the sim over
loopback (what a client sees, timed against the engine's schedule)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from llmobs.sim.dialects.base import RECEIVED_MARK, SENT_MARK, BadRequest, Chunk, Context
from llmobs.sim.dialects.openai import (
    API,
    MAX_N,
    Completion,
    error_body,
    reasoning_tokens,
    request_metrics,
    usage,
)
from llmobs.sim.request import SimRequest
from tests.support.servers import SimFactory
from tests.support.sim import assert_on_schedule
from tests.support.sim_streams import (
    FAST,
    MESSAGES,
    SCHEDULE,
    WORD,
    collect,
    token_frames,
    token_text,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ASSISTANT = {"role": "assistant", "content": ""}
CONTEXT = Context(model="sim", wall_clock=lambda: 1_700_000_000.9, request_id="r1")
HEAD = '"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1700000000,"model":"sim"'


def _job(*tokens: str, finish: str = "stop") -> SimRequest:
    return SimRequest(seq=0, prompt_tokens=1, tokens=tokens, finish_reason=finish)


def _completion(chat: bool = True, ctx: Context = CONTEXT, **body: Any) -> Completion:
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    return Completion(json.dumps({**prompt, **body}).encode(), ctx, chat)


# --- pure: the documents and the renderer ---------------------------------------------------


def test_errors_are_openai_documents_typed_by_status() -> None:
    kinds = {400: "invalid_request_error", 500: "internal_server_error",
             503: "service_unavailable", 429: "service_unavailable"}  # fmt: skip
    for status, kind in kinds.items():
        assert json.loads(error_body("no", status)) == {
            "error": {"message": "no", "type": kind, "param": None, "code": status}
        }


def test_usage_adds_reasoning_only_when_asked() -> None:
    assert usage(4, 12) == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert usage(4, 12, 4)["completion_tokens_details"] == {"reasoning_tokens": 4}
    assert usage(1, 0, 0)["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert reasoning_tokens(_job(*[" a"] * 12)) == 4
    assert reasoning_tokens(_job(" a", " b")) == 0


def test_per_request_metrics_are_the_schedules_own_times() -> None:
    job = _job(" a")
    job.submitted_at, job.prefill_started_at = 1.0, 1.25
    job.first_token_at, job.last_token_at = 1.5, 2.0
    assert request_metrics([job, _job(" b")]) == {  # the first choice's
        "queue_time_ms": 250.0, "time_to_first_token_ms": 250.0, "generation_time_ms": 500.0,
    }  # fmt: skip


def test_the_client_request_streams_and_asks_for_usage() -> None:
    assert API.request("m", "hi", 5, True) == (CHAT, {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
        "stream": True, "stream_options": {"include_usage": True},
    })  # fmt: skip
    assert API.request("m", "hi", 5, False) == (COMPLETIONS, {
        "model": "m", "prompt": "hi", "max_tokens": 5, "stream": True,
        "stream_options": {"include_usage": True},
    })  # fmt: skip


def test_the_request_read() -> None:
    plain = _completion()
    assert (plain.stream, plain.plan.n, plain.plan.max_tokens, plain.plan.seed) == (
        False, 1, None, None)  # fmt: skip
    capped = _completion(max_tokens=9, max_completion_tokens=3, n=MAX_N, seed=4, stream=True)
    assert (capped.stream, capped.plan.max_tokens, capped.plan.n, capped.plan.seed) == (
        True, 3, MAX_N, 4)  # max_completion_tokens wins, as in the API  # fmt: skip
    assert _completion(chat=False, prompt=["abcd", "efgh"]).plan.prompt_tokens == 2
    assert _completion(ignore_eos=True).plan.ignore_eos
    assert not _completion(chat=False, reasoning_effort="low").reasoning  # chat only


@pytest.mark.parametrize(
    ("chat", "body", "problem"),
    [
        (True, {"n": MAX_N + 1}, f"'n' must be <= {MAX_N}"),
        (True, {"n": 0}, "'n' must be >= 1"),
        (True, {"max_completion_tokens": 0}, "'max_completion_tokens' must be >= 1"),
        (True, {"stream_options": [1]}, "'stream_options' must be an object"),
        (False, {"prompt": []}, "'prompt' is required and must be a string or a list of strings"),
        (False, {"prompt": ["a", 1]}, "'prompt' is required and must be a string or a list"),
        (False, {"prompt": None}, "'prompt' is required and must be a string or a list"),
    ],
)
def test_a_bad_request_names_what_is_wrong(chat: bool, body: dict[str, Any], problem: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _completion(chat, **body)
    assert str(refused.value).startswith(problem)


def _event(choices: str, extra: str = "") -> bytes:
    """A chat chunk of the exchange made from ``CONTEXT``, as vLLM writes it."""
    return f'data: {{{HEAD},"choices":[{choices}]{extra}}}\n\n'.encode()


def test_a_chat_stream_is_vllms_bytes() -> None:
    exchange = _completion(stream=True, stream_options={"include_usage": True})
    job = _job(" a", " b", " c")
    role = '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null'
    first = '"delta":{"content":" a"},"logprobs":null,"finish_reason":null'
    last = '"delta":{"content":" b c"},"logprobs":null,"finish_reason":"stop","stop_reason":null'
    usage_ = ',"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}'
    assert exchange.head() == b""
    assert exchange.chunk(0, Chunk((" a",), 0, False), job) == _event(
        f'{{"index":0,{role}}}'
    ) + _event(f'{{"index":0,{first}}}')
    assert exchange.chunk(0, Chunk((" b", " c"), 1, True), job) == _event(f'{{"index":0,{last}}}')
    assert exchange.tail([job]) == _event("", usage_) + b"data: [DONE]\n\n"


def test_a_completion_answered_whole() -> None:
    exchange = _completion(chat=False, model="m")
    assert json.loads(exchange.full([_job(" a", " b", finish="length")])) == {
        "id": "cmpl-r1", "object": "text_completion", "created": 1700000000, "model": "m",
        "choices": [{"index": 0, "text": " a b", "logprobs": None, "finish_reason": "length",
                     "stop_reason": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }  # fmt: skip
    assert _completion(chat=False, stream=True).tail([_job(" a")]) == b"data: [DONE]\n\n"


def test_per_request_metrics_ride_on_the_last_chunk_and_the_whole_answer() -> None:
    ctx = Context("sim", request_id="r1", per_request_metrics=True)
    job = _job(" a")
    job.submitted_at, job.prefill_started_at, job.first_token_at, job.last_token_at = (0, 1, 2, 4)
    metrics = {"queue_time_ms": 1000, "time_to_first_token_ms": 1000, "generation_time_ms": 2000}
    *events, done = _completion(ctx=ctx, stream=True).tail([job]).split(b"\n\n")[:-1]
    assert done == b"data: [DONE]"
    assert [json.loads(e.removeprefix(b"data: "))["metrics"] for e in events] == [metrics]
    with_usage = _completion(ctx=ctx, stream_options={"include_usage": True}).tail([job])
    last = json.loads(with_usage.split(b"\n\n")[0].removeprefix(b"data: "))
    assert (last["choices"], last["usage"]["completion_tokens"], last["metrics"]) == (
        [], 1, metrics)  # fmt: skip
    assert json.loads(_completion(ctx=ctx).full([job]))["metrics"] == metrics
    assert "metrics" not in json.loads(_completion().full([job]))


def test_a_stamp_ends_the_last_text_of_each_token_chunk() -> None:
    """Reasoning and content in one chunk: the stamp goes in the content, the field the
    client reads last; the engine's receipt only in the first token's chunk."""
    ctx = Context("sim", received_ns=5)
    exchange = _completion(ctx=ctx, stream=True, reasoning_effort="low")
    job = _job(*[" w"] * 6)  # two reasoning tokens
    events = [exchange.chunk(0, Chunk(tokens, start, False), job).split(b"\n\n")[-2]
              for tokens, start in (((" a",), 0), ((" b", " c"), 1))]  # fmt: skip
    first, second = (json.loads(e.removeprefix(b"data: "))["choices"][0]["delta"] for e in events)
    assert list(first) == ["reasoning_content"]
    assert first["reasoning_content"].startswith(f" a {RECEIVED_MARK}5 {SENT_MARK}")
    assert second["reasoning_content"] == " b"
    assert second["content"].startswith(f" c {SENT_MARK}")
    assert RECEIVED_MARK not in second["content"]


# --- over loopback: what a client reads -----------------------------------------------------


async def test_chat_stream_is_well_formed(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=12, output_tokens_max=12)
    body = {"model": "m1", "messages": MESSAGES, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    frames = await collect(http, sim.url + CHAT, body)

    assert all(f.raw.startswith(b"data: ") for f in frames)
    assert frames[-1].data == "[DONE]"
    chunks = [f.data for f in frames[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m1" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == ASSISTANT
    texts = [token_text("openai", f) for f in token_frames("openai", frames)]
    assert len(texts) == 12
    assert all(WORD.fullmatch(t) for t in texts)
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish == [None] * 12 + ["stop"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert all("usage" not in c for c in chunks[:-1])


async def test_completions_stream_with_continuous_usage(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, tokens_per_chunk=2)
    body = {"prompt": ["abcd", "efgh"], "max_tokens": 7, "stream": True,
            "stream_options": {"continuous_usage_stats": True}}  # fmt: skip
    frames = await collect(http, sim.url + COMPLETIONS, body)

    assert frames[-1].data == "[DONE]"
    chunks = [f.data for f in frames[:-1]]
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    assert all(c["model"] == "sim-llama-3-8b" for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == [1, 3, 5, 7]  # first token at once, then two per chunk
    words = [len(c["choices"][0]["text"].split()) for c in chunks]
    assert words == [1, 2, 2, 2]
    assert all(c["usage"]["prompt_tokens"] == 2 for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("path", "payload"), [(CHAT, "messages"), (COMPLETIONS, "prompt")])
async def test_non_streaming_reports_usage(
    start_sim: SimFactory, http: aiohttp.ClientSession, path: str, payload: str
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=20, output_tokens_max=20)
    prompt: Any = [{"role": "user", "content": [{"type": "text", "text": "x" * 9}]}]
    body = {payload: prompt if payload == "messages" else "x" * 9}
    async with http.post(sim.url + path, json=body) as resp:
        full = await resp.json()
    async with http.post(sim.url + path, json={**body, "max_completion_tokens": 5}) as resp:
        capped = await resp.json()

    choice = full["choices"][0]
    text = choice["message"]["content"] if payload == "messages" else choice["text"]
    assert len(text.split()) == 20
    assert choice["finish_reason"] == "stop"
    assert full["usage"] == {"prompt_tokens": 3, "completion_tokens": 20, "total_tokens": 23}
    assert capped["choices"][0]["finish_reason"] == "length"
    assert capped["usage"]["completion_tokens"] == 5


async def test_n_choices_interleave_one_chunk_per_step(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    schedule = {**SCHEDULE, "max_batch": 2, "prefill_base": 0.05}
    sim = await start_sim(**schedule, output_tokens_min=6, output_tokens_max=12)
    body = {"messages": MESSAGES, "stream": True, "n": 2, "seed": 5}
    body["stream_options"] = {"include_usage": True}
    frames = await collect(http, sim.url + CHAT, body)

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
    # Two sequences are prefilled in one step (0.05 s each), then decode together: the first
    # pair at 0.1 s, then every 20 ms, on absolute deadlines. The whole schedule may start late
    # by the loop's start-up (at most 50 ms: a clean CI run once saw it 17 ms late), and any
    # one pair may come late without moving the next (a clean run saw the first 4 ms late): so
    # the schedule's start is where its least late pair puts it, and every pair is held to it
    times = [a.at for a, _ in pairs]
    due = [0.1 + 0.02 * i for i in range(len(pairs))]
    start = min(t - d for t, d in zip(times, due, strict=True))
    assert -0.002 <= start <= 0.05, start
    assert_on_schedule([t - start for t in times], due)
    assert chunks[-1]["usage"]["completion_tokens"] == sum(words)
    assert chunks[-1]["usage"]["prompt_tokens"] == 4

    # Choice 0 is what a plain request with the same seed generates; choice 1 differs.
    single = {"messages": MESSAGES, "seed": 5}
    async with http.post(sim.url + CHAT, json={**single, "n": 2}) as resp:
        pair = await resp.json()
    async with http.post(sim.url + CHAT, json=single) as resp:
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
    frames = await collect(http, sim.url + CHAT, body)

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
    usage_ = frames[-2].data["usage"]
    assert usage_["completion_tokens"] == 12
    assert usage_["completion_tokens_details"] == {"reasoning_tokens": 4}

    plain = {"messages": MESSAGES, "reasoning_effort": None, "seed": 1}
    async with http.post(sim.url + CHAT, json=plain) as resp:
        whole = await resp.json()
    message = whole["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


async def test_openai_sdk_reads_the_stream(start_sim: SimFactory) -> None:
    sim = await start_sim(**FAST, output_tokens_min=6, output_tokens_max=6)
    async with AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as client:
        chunks = [
            chunk
            async for chunk in await client.chat.completions.create(
                model="sim-llama-3-8b",
                messages=[{"role": "user", "content": "hello"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        completion = await client.completions.create(model="x", prompt="hi", max_tokens=3)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3
