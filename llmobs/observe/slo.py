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

from typing import NamedTuple

from llmobs.config.objectives import Objective, ObjectiveSet
from llmobs.observe.timing import Outcome, RequestStats


class Verdict(NamedTuple):
    """A counted request's verdict: good, or bad with the objectives it missed."""

    good: bool
    missed: tuple[Objective, ...] = ()


GOOD = Verdict(True)
_FAILED = Verdict(False, (Objective.ERROR,))
# outcomes the user sees as a failure; the others besides OK count in no SLO series
_FAILURES = frozenset({Outcome.UPSTREAM_ERROR, Outcome.UPSTREAM_TIMEOUT, Outcome.SHUTDOWN})


def judge(objective_set: ObjectiveSet, s: RequestStats) -> Verdict | None:
    """The verdict on one finished request; None when it counts in no SLO series."""
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
    return Verdict(False, tuple(missed)) if missed else GOOD
