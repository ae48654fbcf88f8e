"""The prefill backlog against the truth: the simulated engine knows how long the prompts
waiting for their first token will take (its running prefill step's rest, and each waiting
prompt's prefill, ``SimEngine.prefill_backlog``); the sidecar, which knows no throughput,
must say the same within 10 % at every reading of a burst. Both are read at one instant:
the sim and the sidecar share this test's event loop."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import pytest

from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, SimHandle, eventually

# prefill 20 ms + 0.2 ms a token, as the sim's defaults; room in the batch for every prompt
# of the burst, so that prefill runs whenever a prompt waits (the truth: prefill alone)
SCHEDULE: dict[str, Any] = {
    "max_batch": 64, "prefill_base": 0.02, "prefill_per_token": 0.0002, "decode_base": 0.01,
    "decode_per_seq": 0.0, "output_tokens_min": 3, "output_tokens_max": 3,
}  # fmt: skip
BACKLOG = "llmobs_prefill_backlog_seconds"
# what a loaded loop may take to hand a first token from the engine to the relay: at the
# end of each step the truth has it served, the sidecar not yet
DELIVERY_S = 0.02


async def chat(url: str, tokens: int) -> None:
    """One streaming chat request of a prompt of ``tokens`` tokens (the sim counts four
    characters a token), read to its end."""
    body = {
        "model": "m", "stream": True, "max_tokens": 3,
        "messages": [{"role": "user", "content": "abcd" * tokens}],
    }  # fmt: skip
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        await r.read()


async def warm_up(side: SidecarHandle) -> None:
    """Prompts one at a time, then a few together, of sizes and counts that vary: the
    engine's pace, idle and busy, as the sidecar sees it."""
    for tokens in (100, 1200, 400, 1500):
        await chat(side.url, tokens)
    for sizes in ((300, 900, 150), (1200, 200, 700, 1000), (500, 1400, 100, 800, 60)):
        await asyncio.gather(*(chat(side.url, n) for n in sizes))


def backlog(side: SidecarHandle) -> tuple[float, float]:
    """The sidecar's backlog now: seconds, and requests waiting (its whole requests')."""
    seconds = side.value(BACKLOG, pd_role="whole")
    return seconds, side.value("llmobs_prefill_backlog_requests", pd_role="whole")


async def test_the_backlog_agrees_with_the_engine_at_every_reading_of_a_burst(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    side = await start_sidecar(sim.url)
    await warm_up(side)
    sizes = random.Random(50).choices(range(200, 1500), k=16)
    received = sim.engine.counters.requests_received + len(sizes)
    burst = asyncio.gather(*(chat(side.url, n) for n in sizes))
    # read once every prompt reached the engine (before, the truth lacks those in flight)
    await eventually(lambda: sim.engine.counters.requests_received == received)
    loop = asyncio.get_running_loop()
    readings: list[tuple[float, float]] = []
    while not burst.done():
        seconds, waiting = backlog(side)
        truth = sim.engine.prefill_backlog(loop.time())
        if waiting:
            readings.append((seconds, truth))
        await asyncio.sleep(0.1)
    await burst
    # ~3 s of prefill read every 0.1 s: a loaded loop reads less often, never this few
    assert len(readings) >= 5, readings
    assert max(t for _, t in readings) > 1.0  # the burst was a backlog worth reading
    for seconds, truth in readings:
        assert seconds == pytest.approx(truth, rel=0.1, abs=DELIVERY_S), readings
    assert backlog(side) == (0.0, 0.0)  # all served: nothing left


async def test_a_cold_start_says_it_does_not_know_and_an_idle_pod_says_zero(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """No service seen yet, a prompt waiting: no backlog series (unknown, never 0); idle:
    0 seconds, and the busy time counts the wait."""
    sim = await start_sim(**{**SCHEDULE, "prefill_base": 0.5})
    side = await start_sidecar(sim.url)
    assert side.value(BACKLOG, pd_role="whole") == 0.0
    first = asyncio.ensure_future(chat(side.url, 10))
    await eventually(lambda: backlog(side)[1] == 1.0)
    scraped = await side.scrape()
    assert [labels for labels, _ in scraped.get(BACKLOG, [])] == []  # unknown: left out
    await first
    scraped = await side.scrape()
    assert scraped[BACKLOG] == [({"pd_role": "whole"}, 0.0)]
    busy = side.value("llmobs_prefill_busy_seconds_total", pd_role="whole")
    assert 0.5 <= busy < 5.0
    await chat(side.url, 10)
    assert side.value("llmobs_prefill_busy_seconds_total", pd_role="whole") >= busy + 0.5


async def test_a_prompt_whose_client_leaves_stops_waiting(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim: SimHandle = await start_sim(**{**SCHEDULE, "prefill_base": 2.0})
    side = await start_sidecar(sim.url)
    task = asyncio.ensure_future(chat(side.url, 10))
    await eventually(lambda: backlog(side)[1] == 1.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await eventually(lambda: backlog(side)[1] == 0.0)
    assert side.value("llmobs_prefill_backlog_requests", pd_role="whole") == 0.0
