"""``deferred.Deferred``: bookkeeping runs in order, a slice per loop iteration, bounded."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from llmobs.relay.deferred import Deferred


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


async def settle(later: Deferred) -> None:
    for _ in range(1000):
        if not len(later):
            return
        await asyncio.sleep(0)
    raise AssertionError("the queue never drained")


async def test_calls_run_in_order_and_other_callbacks_run_between_slices() -> None:
    loop = asyncio.get_running_loop()
    later = Deferred(slice_ns=300_000)
    order: list[object] = []

    def item(i: int) -> None:
        busy(0.2)
        order.append(i)
        if i == 0:  # what a socket's callback would be: it must not wait for all six
            loop.call_soon(order.append, "io")

    for i in range(6):
        later.call(item, i)
    assert order == []  # nothing runs inside call()
    await settle(later)
    assert [x for x in order if x != "io"] == list(range(6))
    assert 0 < order.index("io") < 6  # between slices, not after the last item


async def test_past_the_bound_each_call_runs_the_oldest_first() -> None:
    later = Deferred(max_queued=3)
    done: list[int] = []
    for i in range(3):
        later.call(done.append, i)
    assert done == []
    later.call(done.append, 3)  # the fourth passes the bound: the oldest runs now
    later.call(done.append, 4)
    assert done == [0, 1]
    assert len(later) == 3
    await settle(later)
    assert done == [0, 1, 2, 3, 4]


async def test_drain_runs_everything_now_and_a_failure_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    later = Deferred()
    done: list[int] = []

    def fail() -> None:
        raise ValueError("boom")

    later.call(done.append, 1)
    later.call(fail)
    later.call(done.append, 2)
    with caplog.at_level(logging.ERROR, logger="llmobs.later"):
        later.drain()
    assert done == [1, 2]
    assert "deferred call" in caplog.text
    await asyncio.sleep(0)  # the scheduled slice finds nothing left to do
    assert done == [1, 2]
