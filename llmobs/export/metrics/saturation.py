"""The prefill backlogs into their families (``catalogue.SATURATION_METRICS``), read when
scraped: each P/D role's waiting requests, their seconds at the engine's fitted pace, their
estimated tokens, and the busy time so far (``observe.saturation``). A role's series appear
with its first request (a whole request's from the start, at 0); a backlog not known yet (no
service seen while prompts wait) is left out rather than read as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from time import perf_counter_ns

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmobs.export.metrics.catalogue import (
    PD_ROLE,
    PREFILL_BACKLOG,
    PREFILL_BACKLOG_REQUESTS,
    PREFILL_BACKLOG_TOKENS,
    PREFILL_BUSY,
    MetricDef,
)
from llmobs.observe.saturation import Backlog, Backlogs

_Read = Callable[[Backlog], float | None]


class SaturationMetrics:
    """The backlog families on ``meter``, read off ``backlogs`` at each scrape (``clock``:
    the relay's monotonic clock, the one the backlogs were told their times in)."""

    def __init__(
        self, meter: Meter, backlogs: Backlogs, clock: Callable[[], int] = perf_counter_ns
    ) -> None:
        self._backlogs = backlogs
        self._clock = clock
        families: tuple[tuple[MetricDef, _Read], ...] = (
            (PREFILL_BACKLOG, lambda b: b.seconds),
            (PREFILL_BACKLOG_TOKENS, lambda b: b.tokens),
            (PREFILL_BACKLOG_REQUESTS, lambda b: b.requests),
        )
        for metric, read in families:
            meter.create_observable_gauge(
                metric.name, [self._observer(read)], metric.unit, metric.description
            )
        meter.create_observable_counter(
            PREFILL_BUSY.name, [self._observer(lambda b: b.busy_seconds)], PREFILL_BUSY.unit,
            PREFILL_BUSY.description,
        )  # fmt: skip

    def _observer(self, read: _Read) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            found = self._backlogs.read(self._clock())
            return [
                Observation(value, {PD_ROLE: role._value_})
                for role, backlog in found.items()
                if (value := read(backlog)) is not None
            ]

        return observe
