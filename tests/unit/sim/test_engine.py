"""The simulated engine over real loopback HTTP: wire format, timing schedule, batching, faults.

Timings are measured at the client, as the proxy will see them, against the schedule the
settings imply: never early, late by a few milliseconds on the median, so that the tests hold
on a loaded CI machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from llmobs.config.settings import ConfigError
from llmobs.sim import (
    ENGINE_KEY,
    SimEngine,
    SimSettings,
    add_sim_arguments,
    build_sim_app,
    run_sim,
    sim_settings_from_args,
)
from llmobs.sim.engine import PauseCause, plan_output
from tests.support.sim import assert_near, assert_on_schedule, gaps

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
MESSAGES = [{"role": "user", "content": "Say something."}]


@dataclass
class Sim:
    """A sim served on a loopback port."""

    url: str
    engine: SimEngine


StartSim = Callable[..., Awaitable[Sim]]


@dataclass
class Event:
    """One SSE event and when it arrived, in seconds since the request was sent."""

    at: float
    data: str

    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.data)
        return parsed


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    runners: list[web.AppRunner] = []

    async def start(**overrides: Any) -> Sim:
        app = build_sim_app(SimSettings(**overrides))
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return Sim(f"http://127.0.0.1:{port}", app[ENGINE_KEY])

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def stream(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> list[Event]:
    """POST a streaming request and collect its SSE events with arrival times."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    events: list[Event] = []
    async with http.post(url, json={**body, "stream": True}, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        while block := await resp.content.readuntil(b"\n\n"):
            assert block.startswith(b"data: ")
            assert block.endswith(b"\n\n")
            events.append(Event(loop.time() - sent, block[6:-2].decode()))
    return events


def token_text(chunk: dict[str, Any]) -> str | None:
    """The generated text a chunk carries; None for role-only and usage-only chunks."""
    if not chunk["choices"]:
        return None
    choice = chunk["choices"][0]
    if "text" in choice:
        return str(choice["text"])
    return None if "role" in choice["delta"] else str(choice["delta"]["content"])


def content_events(events: list[Event]) -> list[tuple[Event, str]]:
    out: list[tuple[Event, str]] = []
    for event in events[:-1]:
        text = token_text(event.json())
        if text is not None:
            out.append((event, text))
    return out


async def eventually(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds; fail after about two seconds."""
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")


async def test_chat_stream_is_well_formed(start_sim: StartSim, http: aiohttp.ClientSession) -> None:
    sim = await start_sim(**FAST, output_tokens_min=12, output_tokens_max=12)
    body = {"model": "m1", "messages": MESSAGES, "stream_options": {"include_usage": True}}
    events = await stream(http, sim.url + CHAT, body)

    assert events[-1].data == "[DONE]"
    chunks = [e.json() for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m1" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [t for _, t in content_events(events)]
    assert len(texts) == 12
    assert all(re.fullmatch(r" [a-z]+", t) for t in texts)
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish == [None] * 12 + ["stop"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert all("usage" not in c for c in chunks[:-1])


async def test_completions_stream_with_continuous_usage(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, tokens_per_chunk=2)
    body = {"prompt": ["abcd", "efgh"], "max_tokens": 7}
    body["stream_options"] = {"continuous_usage_stats": True}
    events = await stream(http, sim.url + COMPLETIONS, body)

    assert events[-1].data == "[DONE]"
    chunks = [e.json() for e in events[:-1]]
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
    start_sim: StartSim, http: aiohttp.ClientSession, path: str, payload: str
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


async def test_timing_follows_the_schedule(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(
        max_batch=1,
        prefill_base=0.1,
        prefill_per_token=0.0,
        decode_base=0.02,
        decode_per_seq=0.0,
        output_tokens_min=20,
        output_tokens_max=20,
    )
    tokens = content_events(await stream(http, sim.url + CHAT, {"messages": MESSAGES}))

    times = [e.at for e, _ in tokens]
    assert_on_schedule(times, [0.1 + 0.02 * i for i in range(20)])
    assert_near(times[0], 0.1)  # TTFT: one prefill step
    assert_near(statistics.median(gaps(times)), 0.02)  # ITL: one decode step
    assert_near(times[-1], 0.1 + 19 * 0.02)  # absolute deadlines: no drift


async def test_every_nth_decode_step_stalls(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(
        **{**FAST, "decode_base": 0.02, "decode_per_seq": 0.0},
        stall_every=5,
        stall_ms=100.0,
        output_tokens_min=16,
        output_tokens_max=16,
    )
    tokens = content_events(await stream(http, sim.url + CHAT, {"messages": MESSAGES}))

    times = [e.at for e, _ in tokens]
    steps = [0.12 if step % 5 == 0 else 0.02 for step in range(1, 16)]
    assert_on_schedule(times, [0.001 + sum(steps[:i]) for i in range(16)])
    between = gaps(times)
    longest = sorted(range(15), key=between.__getitem__)[-3:]
    assert sorted(longest) == [4, 9, 14]  # the gaps after decode steps 5, 10 and 15
    assert_near(statistics.median(between[i] for i in longest), 0.12)
    assert_near(statistics.median(g for i, g in enumerate(between) if i not in longest), 0.02)


async def test_the_engine_keeps_the_truth_of_every_pause(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    """Each stretch in which running requests got no token is kept with its cause: another
    request's prefill (the first stream waits 50 ms for the second's) and the periodic engine
    pause (100 ms on every 5th decode step, for every stream in the batch)."""
    sim = await start_sim(
        **{**FAST, "prefill_base": 0.05, "decode_base": 0.02, "decode_per_seq": 0.0},
        max_batch=4, stall_every=5, stall_ms=100.0, output_tokens_min=12, output_tokens_max=12,
    )  # fmt: skip
    first = asyncio.create_task(stream(http, sim.url + CHAT, {"messages": MESSAGES}))
    await eventually(lambda: sim.engine.counters.decode_steps >= 2)
    second = await stream(http, sim.url + CHAT, {"messages": MESSAGES})
    await first
    assert len(content_events(second)) == 12
    pauses = list(sim.engine.pauses)
    prefills = [p for p in pauses if p.cause is PauseCause.PREFILL]
    engine = [p for p in pauses if p.cause is PauseCause.ENGINE_PAUSE]
    assert [(p.seqs, round(p.end - p.start, 6)) for p in prefills] == [((0,), 0.05)]
    assert engine and all(round(p.end - p.start, 6) == 0.1 for p in engine)
    assert len(engine) == sim.engine.counters.decode_steps // 5
    # a pause while both ran held both; one while only one ran, that one
    assert {p.seqs for p in engine} <= {(0,), (1,), (0, 1)}
    assert any(p.seqs == (0, 1) for p in engine)


async def test_a_full_kv_cache_preempts_the_latest_and_recomputes_it(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    """Two requests whose prompts and outputs outgrow a 20-token cache: the second admitted
    is preempted when the cache would overfill, waits for the first to finish, and is
    recomputed (its prompt and the output so far); the truth keeps its wait, the counter
    vLLM's name."""
    sim = await start_sim(
        **{**FAST, "prefill_base": 0.02, "decode_base": 0.01, "decode_per_seq": 0.0},
        max_batch=4, kv_capacity=20, output_tokens_min=10, output_tokens_max=10,
    )  # fmt: skip
    body = {"messages": MESSAGES}  # a few prompt tokens each
    first = asyncio.create_task(stream(http, sim.url + CHAT, body))
    await eventually(lambda: sim.engine.counters.decode_steps >= 1)
    second = await stream(http, sim.url + CHAT, body)
    assert len(content_events(await first)) == len(content_events(second)) == 10
    assert sim.engine.counters.preemptions >= 1
    preempted = [p for p in sim.engine.pauses if p.cause is PauseCause.PREEMPTION]
    assert len(preempted) == sim.engine.counters.preemptions
    assert {p.seqs for p in preempted} == {(1,)}  # the latest admitted
    assert all(p.end - p.start > 0.02 for p in preempted)  # at least its recompute
    async with http.get(sim.url + "/metrics") as r:
        text = await r.text()
    assert "vllm:num_preemptions_total{" in text


async def test_a_request_named_by_x_request_id_keeps_its_name(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    """As vLLM, the client's X-Request-Id is the response's id; the engine maps it to its
    sequence number, for tests that join the sidecar's spans to the engine's truth."""
    sim = await start_sim(**FAST)
    events = await stream(http, sim.url + CHAT, {"messages": MESSAGES}, {"X-Request-Id": "r-7"})
    assert {e.json()["id"] for e in events if e.data != "[DONE]"} == {"chatcmpl-r-7"}
    assert sim.engine.seqs == {"r-7": 0}


async def test_tokens_per_chunk_batches_the_stream(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(
        **{**FAST, "prefill_base": 0.05, "decode_base": 0.02, "decode_per_seq": 0.0},
        tokens_per_chunk=3,
        output_tokens_min=11,
        output_tokens_max=11,
    )
    tokens = content_events(await stream(http, sim.url + COMPLETIONS, {"prompt": "hi"}))

    assert [len(text.split()) for _, text in tokens] == [1, 3, 3, 3, 1]
    times = [e.at for e, _ in tokens]
    # The first token goes out at once, then every third; the last chunk carries the rest.
    assert_on_schedule(times, [0.05, 0.11, 0.17, 0.23, 0.25])
    assert_near(statistics.median(gaps(times)[:3]), 0.06)


async def test_requests_queue_when_the_batch_is_full(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(
        max_batch=1,
        prefill_base=0.05,
        prefill_per_token=0.0,
        decode_base=0.01,
        decode_per_seq=0.0,
        output_tokens_min=4,
        output_tokens_max=4,
    )
    seen: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            seen.append((sim.engine.counters.waiting, sim.engine.counters.running))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(
        *(stream(http, sim.url + CHAT, {"messages": MESSAGES}) for _ in range(3))
    )
    done.set()
    await watcher

    ttfts = sorted(content_events(events)[0][0].at for events in results)
    # Each request holds the batch for prefill + 3 decode steps = 0.08 s.
    for ttft, expected in zip(ttfts, (0.05, 0.13, 0.21), strict=True):
        assert expected - 0.01 <= ttft <= expected + 0.03, ttfts
    assert max(w for w, _ in seen) == 2
    assert max(r for _, r in seen) == 1
    assert (sim.engine.counters.waiting, sim.engine.counters.running) == (0, 0)
    assert sim.engine.counters.completed == 3


async def test_disconnect_cancels_and_frees_the_batch(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(
        **{**FAST, "decode_base": 0.01}, max_batch=1, output_tokens_min=200, output_tokens_max=200
    )
    async with http.post(sim.url + CHAT, json={"messages": MESSAGES, "stream": True}) as resp:
        for _ in range(3):
            await resp.content.readuntil(b"\n\n")
        assert sim.engine.counters.running == 1
        resp.close()
    await eventually(lambda: sim.engine.counters.cancelled > 0)
    counters = sim.engine.counters
    assert (counters.cancelled, counters.running, counters.waiting, counters.completed) == (
        1,
        0,
        0,
        0,
    )

    events = await stream(http, sim.url + CHAT, {"messages": MESSAGES, "max_tokens": 2})
    assert content_events(events)[0][0].at < 0.05  # admitted at once: the batch is free
    assert sim.engine.counters.completed == 1


async def test_output_is_deterministic(start_sim: StartSim, http: aiohttp.ClientSession) -> None:
    async def text(sim: Sim, **extra: Any) -> str:
        async with http.post(sim.url + COMPLETIONS, json={"prompt": "p", **extra}) as resp:
            return str((await resp.json())["choices"][0]["text"])

    first, twin, other = [await start_sim(**FAST, seed=s) for s in (7, 7, 8)]
    a1, a2 = await text(first), await text(first)
    assert (await text(twin), await text(twin)) == (a1, a2)
    assert a1 != a2  # the sequence number matters ...
    assert await text(other) != a1  # ... and so does the seed
    assert await text(first, seed=42) == await text(other, seed=42)  # a request seed wins


def test_capped_output_is_a_prefix_of_the_uncapped_one() -> None:
    settings = SimSettings(output_tokens_min=50, output_tokens_max=50)
    full, reason = plan_output(settings, seq=3)
    capped, capped_reason = plan_output(settings, seq=3, max_tokens=10)
    assert (reason, capped_reason) == ("stop", "length")
    assert capped == full[:10]
    assert len(plan_output(settings, seq=3, max_tokens=80, ignore_eos=True)[0]) == 80


@pytest.mark.parametrize("streamed", [False, True])
async def test_error_rate_answers_500(
    start_sim: StartSim, http: aiohttp.ClientSession, streamed: bool
) -> None:
    sim = await start_sim(**FAST, error_rate=1.0)
    body = {"messages": MESSAGES, "stream": streamed}
    async with http.post(sim.url + CHAT, json=body) as resp:
        assert resp.status == 500
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert error["type"] == "internal_server_error"
    assert error["code"] == 500
    assert sim.engine.counters.errors == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, b"{not json"),
        (CHAT, b"[1, 2]"),
        (CHAT, b'{"model": "m"}'),
        (CHAT, b'{"messages": []}'),
        (COMPLETIONS, b'{"messages": [{"role": "user", "content": "hi"}]}'),
        (COMPLETIONS, b'{"prompt": "hi", "max_tokens": 0}'),
    ],
)
async def test_bad_requests_answer_400(
    start_sim: StartSim, http: aiohttp.ClientSession, path: str, body: bytes
) -> None:
    sim = await start_sim(**FAST)
    async with http.post(sim.url + path, data=body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == 400
    assert error["message"]


def metric_values(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for name, labels, value in re.findall(r"^([\w:]+)\{(.*)\} (\S+)$", text, re.MULTILINE):
        assert labels == 'model_name="sim-llama-3-8b"'
        values[name] = float(value)
    return values


async def test_metrics_expose_vllm_gauges(start_sim: StartSim, http: aiohttp.ClientSession) -> None:
    sim = await start_sim(
        **{**FAST, "decode_base": 0.01}, max_batch=1, output_tokens_min=30, output_tokens_max=30
    )
    body = {"messages": MESSAGES}
    requests = [asyncio.create_task(stream(http, sim.url + CHAT, body)) for _ in range(2)]
    await eventually(lambda: sim.engine.counters.waiting + sim.engine.counters.running == 2)
    async with http.get(sim.url + "/metrics") as resp:
        assert resp.status == 200
        busy = metric_values(await resp.text())
    await asyncio.gather(*requests)
    async with http.get(sim.url + "/metrics") as resp:
        idle = metric_values(await resp.text())

    assert busy["vllm:num_requests_waiting"] == 1
    assert busy["vllm:num_requests_running"] == 1
    assert 0 < busy["vllm:kv_cache_usage_perc"] <= 1
    assert busy["vllm:request_success_total"] == 0
    assert idle["vllm:num_requests_running"] == idle["vllm:kv_cache_usage_perc"] == 0
    assert idle["vllm:request_success_total"] == 2


async def test_models_health_and_received_headers(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, model="tiny")
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 200
    async with http.get(sim.url + "/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny"]

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = {"Traceparent": traceparent}
    async with http.post(sim.url + CHAT, json={"messages": MESSAGES}, headers=headers) as resp:
        assert (await resp.json())["model"] == "tiny"
    assert sim.engine.counters.last_headers["traceparent"] == traceparent
    assert sim.engine.counters.requests_received == 1


def test_settings_from_flags_and_environment() -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(["--max-batch", "4", "--stall-ms", "50"])
    environ = {"LLMOBS_SIM_MAX_BATCH": "2", "LLMOBS_SIM_ERROR_RATE": "0.25"}
    settings = sim_settings_from_args(args, environ)
    assert (settings.max_batch, settings.stall_ms, settings.error_rate) == (4, 50.0, 0.25)
    assert settings.decode_base == 0.015

    with pytest.raises(ConfigError, match="LLMOBS_SIM_ERROR_RATE"):
        sim_settings_from_args(parser.parse_args([]), {"LLMOBS_SIM_ERROR_RATE": "2"})
    with pytest.raises(ConfigError, match="--tokens-per-chunk"):
        sim_settings_from_args(parser.parse_args(["--tokens-per-chunk", "0"]), {})
    with pytest.raises(ConfigError, match="--output-tokens-max"):
        SimSettings(output_tokens_min=10, output_tokens_max=5)


async def test_openai_sdk_reads_the_stream(start_sim: StartSim) -> None:
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


async def test_run_sim_serves_until_cancelled(
    http: aiohttp.ClientSession, capsys: pytest.CaptureFixture[str]
) -> None:
    task = asyncio.create_task(run_sim(SimSettings(port=0, model="cli-model")))
    printed: list[str] = []

    def listening() -> bool:
        printed.append(capsys.readouterr().out)
        return "\n" in "".join(printed)

    await eventually(listening)
    line = "".join(printed).splitlines()[0]
    match = re.fullmatch(r"llmobs sim: listening on (http://\S+) \(model cli-model\)", line)
    assert match is not None
    async with http.get(match.group(1) + "/health") as resp:
        assert resp.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
