"""Realistic traffic (``tools.traffic``): each dialect's request on its own route, named as
the sidecar names it, and a client's timing of a stream from the simulated engine."""

from __future__ import annotations

import aiohttp
import pytest

from llmobs.observe.dialects import RESPONSES, route_for_path
from llmobs.tools.traffic import DIALECTS, MIXED, Result, Workload, run_load, stream_call
from tests.support.servers import SimFactory


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_goes_to_a_route_of_its_name(dialect: str) -> None:
    workload = Workload("m", seed=3, dialect=dialect)
    for _ in range(20):  # chat and completions alike
        call = workload.next()
        assert route_for_path(call.path).name == dialect, call.path
        assert route_for_path(call.path).streams(call.body.get("stream"))


def test_mixed_takes_each_in_turn_and_the_old_name_is_the_one_name() -> None:
    mixed = Workload("m", dialect=MIXED)
    assert [route_for_path(mixed.next().path).name for _ in DIALECTS] == list(DIALECTS)
    assert route_for_path(Workload("m", dialect="responses").next().path) is RESPONSES
    with pytest.raises(ValueError, match="unknown dialect 'grpc'"):
        Workload("m", dialect="grpc")


def test_the_workload_is_seeded() -> None:
    first, second = Workload("m", seed=7), Workload("m", seed=7)
    assert [first.next() for _ in range(5)] == [second.next() for _ in range(5)]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_client_times_every_chunk_of_the_stream(
    start_sim: SimFactory, dialect: str
) -> None:
    sim = await start_sim(prefill_base=0.0, prefill_per_token=0.0, decode_base=0.001)
    call = Workload(sim.settings.model, seed=1, dialect=dialect).next()
    async with aiohttp.ClientSession() as session:
        result = await stream_call(session, sim.url, call)
    assert result.ok and result.ttft is not None, result
    assert result.chunk_times[0] == result.ttft and list(result.chunk_times) == sorted(
        result.chunk_times)  # fmt: skip
    assert result.tokens >= 1 and result.duration >= result.chunk_times[-1]


async def test_the_closed_loop_stops_at_its_count(start_sim: SimFactory) -> None:
    sim = await start_sim(prefill_base=0.0, prefill_per_token=0.0, decode_base=0.001,
                          output_tokens_min=3, output_tokens_max=3)  # fmt: skip
    seen: list[Result] = []
    sent = await run_load(sim.url, Workload("m"), duration=30.0, concurrency=2,
                          on_result=seen.append, max_requests=5)  # fmt: skip
    assert sent == len(seen) == 5 and all(r.ok for r in seen)
