"""Service-level objectives: which requests were good, judged one by one as they end.

An objective set bounds what a user feels of one request: time to first token, time per output
token, the longest gap between two tokens (or any stall at all), the whole duration. A request
is *good* when it meets every bound of its set, judged jointly on the request itself: "TTFT ok
and TPOT ok" is not something two histograms can answer, since their joint distribution is
lost. A request that fails in a way the user sees is *bad* (``error``): a 5xx, an engine error
or timeout, a stream cut short by a shutdown. One the user brought on themselves is neither: a
client that went away, a 4xx, a request the sidecar refused (these count in no SLO series).

Pure: the sink judges each finished ``RequestStats`` here (``judge``) and counts the
verdict; the rules turn the counts into error-budget burn rates (docs/slo.md).

The objectives themselves are declared in ``llmobs.config.objectives``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from llmobs.config.objectives import Objective, ObjectiveSet
from llmobs.observe.causes import STALL_CAUSES, Stall, StallCause
from llmobs.observe.phases import Phase, TtftPhases
from llmobs.observe.timing import Outcome, RequestStats

NO_CAUSE = "none"  # a miss nothing here explains: tpot, duration, error; a gap with no stall


class Verdict(NamedTuple):
    """A counted request's verdict: good, or bad with the objectives it missed and, for each,
    why (``miss_cause``)."""

    good: bool
    missed: tuple[Objective, ...] = ()
    causes: tuple[str, ...] = ()  # one per missed objective, in the same order


GOOD = Verdict(True)
_FAILED = Verdict(False, (Objective.ERROR,), (NO_CAUSE,))
# outcomes the user sees as a failure; the others besides OK count in no SLO series
_FAILURES = frozenset({Outcome.UPSTREAM_ERROR, Outcome.UPSTREAM_TIMEOUT, Outcome.SHUTDOWN})


def judge(
    objective_set: ObjectiveSet,
    s: RequestStats,
    phases: TtftPhases | None = None,
    stalls: Sequence[Stall] = (),
) -> Verdict | None:
    """The verdict on one finished request; None when it counts in no SLO series.
    ``phases`` and ``stalls`` (with their causes) say why each miss happened."""
    outcome = s.outcome
    if outcome is not Outcome.OK:
        return _FAILED if outcome in _FAILURES else None
    if s.status >= 500:
        return _FAILED
    if s.status >= 400:
        return None
    missed: list[Objective] = []
    if objective_set.ttft is not None and s.ttft_s is not None and s.ttft_s > objective_set.ttft:
        missed.append(Objective.TTFT)
    if objective_set.tpot is not None and s.tpot_s is not None and s.tpot_s > objective_set.tpot:
        missed.append(Objective.TPOT)
    if objective_set.max_gap is not None and s.itl_count and s.itl_max > objective_set.max_gap:
        missed.append(Objective.MAX_GAP)
    if objective_set.no_stalls and s.stalls:
        missed.append(Objective.STALL)
    if objective_set.duration is not None and s.duration_s > objective_set.duration:
        missed.append(Objective.DURATION)
    if not missed:
        return GOOD
    return Verdict(False, tuple(missed), tuple(miss_cause(m, phases, stalls) for m in missed))


def latency_ratio(objective_set: ObjectiveSet, s: RequestStats) -> float | None:
    """How close a request came to its latency bounds: the larger of its TTFT over the TTFT
    bound and its TPOT over the TPOT bound (1: at a bound; above: missed). What load drives,
    in the units of the objective, so that requests of every model and tenant, each against
    its own bounds, share one scale (the saturation signal's, docs/metrics.md). None: no
    bound applies to what it has."""
    ratio: float | None = None
    ttft, tpot = objective_set.ttft, objective_set.tpot
    if ttft and s.ttft_s is not None:
        ratio = s.ttft_s / ttft
    if tpot and s.tpot_s is not None:
        ratio = max(ratio or 0.0, s.tpot_s / tpot)
    return ratio


def miss_causes(objective: Objective) -> tuple[str, ...]:
    """Every cause a miss of ``objective`` can be counted under (``miss_cause``): a closed
    set per objective, whose series start at 0."""
    if objective is Objective.TTFT:
        return (*(p._value_ for p in Phase), NO_CAUSE)
    if objective is Objective.STALL:
        return tuple(c._value_ for c in STALL_CAUSES)
    if objective is Objective.MAX_GAP:
        return (*(c._value_ for c in STALL_CAUSES), NO_CAUSE)
    return (NO_CAUSE,)


def miss_cause(objective: Objective, phases: TtftPhases | None, stalls: Sequence[Stall]) -> str:
    """Why an objective was missed: a TTFT miss under the phase that took most of it, a gap
    or stall miss under the cause of the request's longest stall (``unknown`` for a stall
    past those judged); anything else ``none``."""
    if objective is Objective.TTFT:
        return phases.largest()._value_ if phases is not None else NO_CAUSE
    if objective in (Objective.MAX_GAP, Objective.STALL):
        if stalls:
            return max(stalls, key=lambda x: x.end_ns - x.start_ns).cause._value_
        return StallCause.UNKNOWN._value_ if objective is Objective.STALL else NO_CAUSE
    return NO_CAUSE
