"""Disaggregated prefill and decode into their families (``catalogue.PD_METRICS``).

A consumer of request records, as ``sink`` is, that the recorder hands legs' records (which
never reach the request families) and disaggregated users' requests' (``observe.disagg``).
Plain OpenTelemetry instruments on the scraped meter: labels by role, outcome and phase
only, closed sets; the joins read the join's own counts when scraped.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import Meter, Observation

from llmobs.export.metrics.catalogue import (
    OUTCOME,
    PD_JOINS,
    PD_LEG_DURATION,
    PD_LEG_PHASE,
    PD_REQUESTS,
    PD_ROLE,
    PHASE,
    RESULT,
)
from llmobs.export.metrics.otel import counter_of, histogram_of
from llmobs.observe.disagg import LEGS, PdJoin, PdRole
from llmobs.observe.record import RequestRecord


class PdMetrics:
    """The P/D families on ``meter``; ``join``: this process's join, whose counts are
    scraped (None: no listener of this process sees decode legs)."""

    def __init__(self, meter: Meter, join: PdJoin | None = None) -> None:
        self._requests = counter_of(meter, PD_REQUESTS)
        self._duration = histogram_of(meter, PD_LEG_DURATION)
        self._phase = histogram_of(meter, PD_LEG_PHASE)
        if join is not None:
            meter.create_observable_counter(
                PD_JOINS.name, [lambda _: _joins(join)], PD_JOINS.unit, PD_JOINS.description
            )

    def consume(self, record: RequestRecord) -> None:
        """A finished request with a part in P/D (others pass)."""
        role = record.pd
        if role is PdRole.WHOLE:
            return
        stats = record.stats
        outcome = stats.outcome._value_
        self._requests.add(1, {PD_ROLE: role._value_, OUTCOME: outcome})
        if role not in LEGS:
            return
        self._duration.record(stats.duration_s, {PD_ROLE: role._value_, OUTCOME: outcome})
        phases = record.phases
        if phases is not None:
            for phase, ns in phases.present():
                self._phase.record(ns / 1e9, {PD_ROLE: role._value_, PHASE: phase._value_})


def _joins(join: PdJoin) -> Iterable[Observation]:
    """The join's own counts, read when scraped."""
    return (
        Observation(join.joined, {RESULT: "joined"}),
        Observation(join.missing, {RESULT: "no_decode_leg"}),
        Observation(join.orphaned, {RESULT: "orphan_leg"}),
    )
