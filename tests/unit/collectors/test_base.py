"""Polling collectors (``collectors.base``), on a collector that answers from a script: the
last good sample kept and cleared when a poll fails (stale values would lie), up and down
logged once per transition, unavailability no error but a failure counted, the time a poll
took on an injected clock; polling on a schedule after a first delay until cancelled; the
runner's start and stop, which closes every collector even when one fails to; and the status
gauges every collector exports."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest
from prometheus_client import CollectorRegistry

from llmobs.collectors.base import PollingCollector, Runner, Unavailable, register_status
from llmobs.export.metrics.catalogue import COLLECTOR_DURATION, COLLECTOR_ERRORS, COLLECTOR_UP
from llmobs.export.telemetry import build_telemetry

Answer = int | BaseException


class Scripted(PollingCollector[int]):
    """Each poll's answer from ``script`` (a number, or what it raises; the last answer
    repeats); counts its closes and wakes ``polled`` at each poll."""

    def __init__(
        self,
        name: str,
        script: list[Answer],
        interval: float = 60.0,
        first_delay: float = 0.0,
        close_error: Exception | None = None,
    ) -> None:
        clock = itertools.count(10.0, 0.25).__next__  # a quarter second a reading
        super().__init__(name, interval, first_delay=first_delay, clock=clock)
        self.script = script
        self.close_error = close_error
        self.closes = 0
        self.polled = asyncio.Event()

    async def poll(self) -> int:
        self.polled.set()
        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def close(self) -> None:
        self.closes += 1
        if self.close_error is not None:
            raise self.close_error


async def test_a_good_poll_keeps_its_sample_and_the_time_it_took() -> None:
    collector = Scripted("scripted", [7, 8])
    assert (collector.snapshot, collector.up, collector.polls) == (None, False, 0)
    await collector.collect_once()
    assert (collector.snapshot, collector.up, collector.polls) == (7, True, 1)
    assert collector.duration_s == 0.25  # one step of the clock between start and end
    await collector.collect_once()
    assert (collector.snapshot, collector.errors, collector.polls) == (8, 0, 2)


async def test_down_and_up_are_logged_once_each_and_only_failures_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script: list[Answer] = [1, Unavailable("no GPU here"), Unavailable("no GPU here"),
                            RuntimeError("lost"), 2, 3]  # fmt: skip
    collector = Scripted("scripted", script)
    seen = []
    with caplog.at_level(logging.INFO, "llmobs.collectors"):
        for _ in range(6):
            await collector.collect_once()
            seen.append((collector.snapshot, collector.up, collector.errors))
    assert seen == [(1, True, 0), (None, False, 0), (None, False, 0), (None, False, 1),
                    (2, True, 1), (3, True, 1)]  # fmt: skip
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "collector scripted is down: no GPU here"),
        (logging.INFO, "collector scripted is up"),
    ]
    assert collector.duration_s == 0.25 and collector.polls == 6


async def test_a_first_failure_is_a_warning_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    collector = Scripted("scripted", [ValueError("bad page"), Unavailable()])
    with caplog.at_level(logging.INFO, "llmobs.collectors"):
        await collector.collect_once()
        await collector.collect_once()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "collector scripted is down: ValueError: bad page"),
    ]
    assert (collector.up, collector.errors, collector.polls) == (False, 1, 2)
    collector.count_error()  # a partial failure: the poll goes on, counted all the same
    assert collector.errors == 2


async def test_a_cancelled_poll_is_cancelled_not_down() -> None:
    collector = Scripted("scripted", [5, asyncio.CancelledError()])
    await collector.collect_once()
    with pytest.raises(asyncio.CancelledError):
        await collector.collect_once()
    assert (collector.snapshot, collector.up, collector.errors, collector.polls) == (5, True, 0, 2)


async def test_run_polls_after_its_first_delay_until_cancelled() -> None:
    soon = Scripted("soon", [1], interval=0.0)
    late = Scripted("late", [1], first_delay=3600.0)
    tasks = [asyncio.create_task(c.run()) for c in (soon, late)]
    for _ in range(3):  # three polls, the loop free between them
        soon.polled.clear()
        await soon.polled.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(task.cancelled() for task in tasks)
    assert soon.polls >= 3 and soon.up
    assert late.polls == 0  # still waiting for its first delay


async def test_the_runner_stops_every_collector_and_closes_each_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = Scripted("broken", [1], close_error=OSError("busy"))
    fine = Scripted("fine", [2])
    runner = Runner([broken, fine])
    runner.start()
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert {"llmobs-collector-broken", "llmobs-collector-fine"} <= names
    await asyncio.wait_for(asyncio.gather(broken.polled.wait(), fine.polled.wait()), 10)
    with caplog.at_level(logging.WARNING, "llmobs.collectors"):
        await runner.stop()
    assert (broken.closes, fine.closes) == (1, 1)  # the other closed all the same
    assert [r.getMessage() for r in caplog.records] == ["collector broken did not close cleanly"]
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert not {"llmobs-collector-broken", "llmobs-collector-fine"} & names
    polls = (broken.polls, fine.polls)
    await asyncio.sleep(0)
    assert (broken.polls, fine.polls) == polls  # no poll after the stop


async def test_every_collector_reports_up_duration_and_errors() -> None:
    """Up from the start (0 until a poll succeeds), the duration only once polled, errors
    as counted: one series each, by the collector's name."""
    telemetry = build_telemetry(self_metrics=False)
    up, down = Scripted("up", [1]), Scripted("down", [RuntimeError("x")])
    register_status(telemetry.meter, [up, down])
    registry: CollectorRegistry = telemetry.registry

    def value(metric: str, name: str) -> float | None:
        return registry.get_sample_value(metric, {"collector": name})

    up_, duration, errors = (COLLECTOR_UP.prometheus, COLLECTOR_DURATION.prometheus,
                             COLLECTOR_ERRORS.prometheus)  # fmt: skip
    assert (value(up_, "up"), value(duration, "up"), value(errors, "down")) == (0, None, 0)
    await up.collect_once()
    await down.collect_once()
    assert (value(up_, "up"), value(up_, "down")) == (1, 0)
    assert (value(duration, "up"), value(duration, "down")) == (0.25, 0.25)
    assert (value(errors, "up"), value(errors, "down")) == (0, 1)
    telemetry.shutdown()
