"""Polling collectors: sample in the background, keep the last snapshot, report up/duration.

A collector's ``poll()`` runs every ``interval`` seconds in an asyncio task (blocking work,
such as NVML calls, goes to a worker thread inside ``poll``); a scrape never waits for it, it
reads ``snapshot``, the last complete sample, through observable instruments. A poll that
fails clears the snapshot (stale values would lie) and marks the collector down. Being
unavailable (no GPU, no driver, an engine without /metrics) is a normal state: it is logged
once, on the transition, and is not an error; anything else is counted in ``errors``.

Every collector exports ``llmobs_collector_up``, ``llmobs_collector_scrape_duration_seconds``
and ``llmobs_collector_errors_total`` with its ``collector`` name (``register_status``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmobs.export.metrics.catalogue import (
    COLLECTOR,
    COLLECTOR_DURATION,
    COLLECTOR_ERRORS,
    COLLECTOR_UP,
)

log = logging.getLogger("llmobs.collectors")

S = TypeVar("S")


class Unavailable(Exception):
    """Nothing to collect, and that is normal: no GPU, no NVML, no engine metrics."""


class Absent(Unavailable):
    """Nothing to collect on this machine at all (no NVML, no GPU): a state, not an outage.
    A collector that has never been up stops there: one line in the log, and no
    ``llmobs_collector_up`` series, so that ``LLMObsCollectorDown`` fires on a GPU that
    stopped answering, never on a node that has none. Once up, it is a collector down."""


class PollingCollector(abc.ABC, Generic[S]):
    """Polls ``poll()`` every ``interval`` seconds; keeps the last snapshot and its status."""

    def __init__(
        self,
        name: str,
        interval: float,
        *,
        first_delay: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.name = name
        self.interval = interval
        self.first_delay = first_delay
        self._clock = clock
        self.snapshot: S | None = None
        self.up = False
        self.duration_s = 0.0
        self.errors = 0
        self.polls = 0
        self._reported: str | None = None  # the state last logged: "up" or "down"
        self.absent = False  # nothing to collect here (``Absent``): stopped, no status
        self.polled = asyncio.Event()  # set once the first poll has ended, however it did

    @abc.abstractmethod
    async def poll(self) -> S:
        """One sample. Raise ``Unavailable`` when there is nothing to collect."""

    async def close(self) -> None:
        """Release what ``poll`` acquired; called once, after the last poll."""

    def count_error(self) -> None:
        """A partial failure: the poll goes on (one GPU of several, one field)."""
        self.errors += 1

    async def collect_once(self) -> None:
        """Poll once and update the snapshot and the status; never raises (but cancels)."""
        start = self._clock()
        try:
            snapshot = await self.poll()
        except asyncio.CancelledError:
            raise
        except Absent as exc:
            if self._reported is None:  # never up: this machine has nothing to collect
                self.absent = True
                log.info("collector %s is off: %s; nothing to collect here", self.name, exc)
            else:
                self._down(str(exc), start, logging.WARNING)
        except Unavailable as exc:
            self._down(str(exc) or type(exc).__name__, start, logging.INFO)
        except Exception as exc:
            self.errors += 1
            self._down(f"{type(exc).__name__}: {exc}", start, logging.WARNING)
        else:
            self.snapshot = snapshot
            self.up = True
            self.duration_s = self._clock() - start
            if self._reported == "down":
                log.info("collector %s is up", self.name)
            self._reported = "up"
        finally:
            self.polls += 1
            self.polled.set()

    def _down(self, reason: str, start: float, level: int) -> None:
        self.snapshot = None
        self.up = False
        self.duration_s = self._clock() - start
        if self._reported != "down":
            log.log(level, "collector %s is down: %s", self.name, reason)
        self._reported = "down"

    async def run(self) -> None:
        """Poll forever at ``interval`` (after ``first_delay``); cancel to stop."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.first_delay)
        while not self.absent:
            started = loop.time()
            await self.collect_once()
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))


class Runner:
    """Starts collectors as tasks and stops them (then ``close()``s them): a lifecycle."""

    def __init__(self, collectors: Sequence[PollingCollector[Any]]) -> None:
        self.collectors = tuple(collectors)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for c in self.collectors:
            self._tasks.append(asyncio.create_task(c.run(), name=f"llmobs-collector-{c.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for c in self.collectors:
            try:
                await c.close()
            except Exception:
                log.warning("collector %s did not close cleanly", c.name, exc_info=True)


def register_status(meter: Meter, collectors: Sequence[PollingCollector[Any]]) -> None:
    """``llmobs_collector_up``, ``..._scrape_duration_seconds``, ``..._errors_total``."""
    collectors = tuple(collectors)

    def up(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(int(c.up), {COLLECTOR: c.name}) for c in collectors if not c.absent]

    def duration(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(c.duration_s, {COLLECTOR: c.name})
            for c in collectors
            if c.polls and not c.absent
        ]

    def errors(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(c.errors, {COLLECTOR: c.name}) for c in collectors if not c.absent]

    for metric, callback in ((COLLECTOR_UP, up), (COLLECTOR_DURATION, duration)):
        meter.create_observable_gauge(
            metric.name, [callback], unit=metric.unit, description=metric.description
        )
    meter.create_observable_counter(
        COLLECTOR_ERRORS.name, [errors], unit=COLLECTOR_ERRORS.unit,
        description=COLLECTOR_ERRORS.description,
    )  # fmt: skip
