"""The simulated engine over real loopback HTTP: timing schedule, batching, pauses, preemption,
cancellation, determinism (what each dialect writes: tests/unit/sim/dialects/).

Timings are measured at the client, as the proxy will see them, against the schedule the
settings imply: never early, late by a few milliseconds on the median, so that the tests hold
on a loaded CI machine.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from llmobs.sim import (
    SimSettings,
)
from llmobs.sim.engine import PauseCause, plan_output
from tests.support.servers import SimFactory, SimHandle, eventually
from tests.support.sim import assert_near, assert_on_schedule, gaps

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
MESSAGES = [{"role": "user", "content": "Say something."}]


@dataclass
class Event:
    """One SSE event and when it arrived, in seconds since the request was sent."""

    at: float
    data: str

    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.data)
        return parsed


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


async def test_timing_follows_the_schedule(
    start_sim: SimFactory, http: aiohttp.ClientSession
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
    start_sim: SimFactory, http: aiohttp.ClientSession
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
    start_sim: SimFactory, http: aiohttp.ClientSession
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
    start_sim: SimFactory, http: aiohttp.ClientSession
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
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    """As vLLM, the client's X-Request-Id is the response's id; the engine maps it to its
    sequence number, for tests that join the sidecar's spans to the engine's truth."""
    sim = await start_sim(**FAST)
    events = await stream(http, sim.url + CHAT, {"messages": MESSAGES}, {"X-Request-Id": "r-7"})
    assert {e.json()["id"] for e in events if e.data != "[DONE]"} == {"chatcmpl-r-7"}
    assert sim.engine.seqs == {"r-7": 0}


async def test_tokens_per_chunk_batches_the_stream(
    start_sim: SimFactory, http: aiohttp.ClientSession
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
    start_sim: SimFactory, http: aiohttp.ClientSession
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
    start_sim: SimFactory, http: aiohttp.ClientSession
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


async def test_output_is_deterministic(start_sim: SimFactory, http: aiohttp.ClientSession) -> None:
    async def text(sim: SimHandle, **extra: Any) -> str:
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


async def test_the_engine_tells_its_prefill_backlog_and_busy_time(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    """Its truths for the sidecar's backlog and a GPU's utilisation: with two prompts queued
    behind one in its prefill step, the step's rest and their two prefills; in steps, busy."""
    sim = await start_sim(
        max_batch=1, prefill_base=0.2, prefill_per_token=0.0, decode_base=0.01,
        decode_per_seq=0.0, output_tokens_min=2, output_tokens_max=2,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    assert sim.engine.prefill_backlog(loop.time()) == 0.0
    streams = asyncio.gather(
        *(stream(http, sim.url + CHAT, {"messages": MESSAGES}) for _ in range(3))
    )
    await eventually(lambda: sim.engine.counters.waiting == 2)
    left = sim.engine.prefill_backlog(loop.time())
    assert 0.4 < left <= 0.6 + 1e-9  # two prefills and what is left of the first
    await asyncio.sleep(0.05)
    assert sim.engine.prefill_backlog(loop.time()) == pytest.approx(left - 0.05, abs=0.02)
    await streams
    assert sim.engine.prefill_backlog(loop.time()) == 0.0
    # three prefills and three decode steps (a first token is its prefill's, a second a step's)
    assert sim.engine.counters.busy_seconds == pytest.approx(3 * 0.2 + 3 * 0.01)
    async with http.get(sim.url + "/metrics") as r:
        text = await r.text()
    assert "sim:prefill_backlog_seconds{" in text
    assert "sim:busy_seconds_total{" in text
