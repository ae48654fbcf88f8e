"""The bench's load (``bench.stamped_load``) against the simulated engine over loopback: the
stamps read with ``bytes.find``, every chunk counted, no collection while a cell runs."""

from __future__ import annotations

import gc
import json
import time

import aiohttp

from llmobs.bench.stamped_load import (
    LoadSpec,
    Stream,
    one_request,
    parse_events,
    request_body,
    run_load,
    session_for,
)
from tests.support.servers import SimFactory


def test_parse_events_reads_stamps_with_bytes_find() -> None:
    s = Stream(0)
    block = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":" a llmobs_received_ns=5 llmobs_sent_ns=7"}}]}'
        b'\n\ndata: {"choices":[{"delta":{"content":" b llmobs_sent_ns=9"}}]}'
    )
    parse_events(block, s, 100, record=True)
    assert (s.received_ns, s.chunks, list(s.sent), list(s.arrivals)) == (5, 2, [7, 9], [100] * 2)
    counted = Stream(0)
    parse_events(block, counted, 100, record=False)
    assert (counted.chunks, len(counted.sent)) == (2, 0)


async def test_sim_stamps_every_token_event(start_sim: SimFactory) -> None:
    sim = await start_sim(stamp=True, prefill_base=0.0, prefill_per_token=0.0,
                          decode_base=0.002, decode_per_seq=0.0)  # fmt: skip
    spec = LoadSpec(sim.url, 1, 0.0, 6)
    async with session_for(1) as session:
        s = await one_request(session, sim.url + "/v1/chat/completions", request_body(spec),
                              {"Content-Type": "application/json"}, True)  # fmt: skip
        async with session.post(sim.url + "/v1/chat/completions", data=request_body(spec),
                                headers={"Content-Type": "application/json"}) as r:  # fmt: skip
            text = await r.text()
    assert s.ok and s.chunks == 6
    assert s.send_ns < s.received_ns < s.sent[0]  # one clock across client and engine
    assert list(s.sent) == sorted(s.sent)
    assert all(a >= t for a, t in zip(s.arrivals, s.sent, strict=True))
    # the stamp is in the token text, whose JSON stays valid; role and [DONE] carry none
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    contents = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert contents[0] == ""
    assert "llmobs_received_ns=" in contents[1] and "llmobs_sent_ns=" in contents[1]
    assert all("llmobs_sent_ns=" in c and "received" not in c for c in contents[2:])


async def test_sim_without_stamp_is_unchanged(start_sim: SimFactory) -> None:
    sim = await start_sim(decode_base=0.001)
    async with aiohttp.ClientSession() as session, session.post(
        sim.url + "/v1/chat/completions", data=request_body(LoadSpec(sim.url, 1, 0.0, 3)),
        headers={"Content-Type": "application/json"},
    ) as r:  # fmt: skip
        text = await r.text()
    assert "llmobs_" not in text


async def test_closed_loop_counts_every_chunk(start_sim: SimFactory) -> None:
    sim = await start_sim(stamp=True, prefill_base=0.0, prefill_per_token=0.0,
                          decode_base=0.002, decode_per_seq=0.0)  # fmt: skip
    result = await run_load(LoadSpec(sim.url, 3, 0.2, 5))
    assert result.streams and all(s.ok for s in result.streams)
    assert result.chunks == 5 * len(result.streams) == sim.engine.counters.generation_tokens


async def test_the_collector_never_runs_during_a_cell(start_sim: SimFactory) -> None:
    """A collection in the load generator stalls its loop: every chunk in flight would arrive
    late, charged to the target. None runs while a cell's load does; it is back after."""
    sim = await start_sim(stamp=True, prefill_base=0.0, prefill_per_token=0.0,
                          decode_base=0.002, decode_per_seq=0.0)  # fmt: skip
    collections: list[int] = []  # when each started

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(time.monotonic_ns())

    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        result = await run_load(LoadSpec(sim.url, 3, 0.2, 5))
    finally:
        gc.callbacks.remove(seen)
    assert result.streams and all(s.ok for s in result.streams)
    during = [t for t in collections if result.started_ns <= t <= result.ended_ns]
    assert during == []  # (aiohttp and the engine allocate enough for several otherwise)
    assert gc.isenabled()


async def test_the_open_loop_drops_arrivals_past_its_streams(start_sim: SimFactory) -> None:
    """Poisson arrivals far faster than one slow stream can take: the first is sent, those that
    find it in flight are counted as dropped, and what was sent is drained."""
    sim = await start_sim(stamp=True, prefill_base=0.0, prefill_per_token=0.0,
                          decode_base=0.05, decode_per_seq=0.0)  # fmt: skip
    result = await run_load(LoadSpec(sim.url, 1, 0.2, 5, arrival_rate=1000.0, seed=1))
    assert len(result.streams) >= 1 and all(s.ok for s in result.streams)
    assert result.dropped > 0
    assert result.chunks == 5 * len(result.streams) == sim.engine.counters.generation_tokens
    assert result.ended_ns - result.started_ns >= 0.2e9  # the last stream drained
    assert result.wall_s == (result.ended_ns - result.started_ns) / 1e9
