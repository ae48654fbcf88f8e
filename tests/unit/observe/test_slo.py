"""Service-level objectives (``llmobs.observe.slo``): each request judged jointly against its set's
bounds, and which outcomes count. Which set a request gets, the objectives file and the settings
that declare the default set: ``tests/unit/config/test_objectives.py``."""

from __future__ import annotations

import pytest

from llmobs.config.objectives import (
    Objective,
    ObjectiveSet,
)
from llmobs.observe.causes import Stall, StallCause
from llmobs.observe.phases import TtftPhases
from llmobs.observe.slo import GOOD, NO_CAUSE, Verdict, judge, latency_ratio, miss_causes
from llmobs.observe.timing import Outcome, RequestStats, TokenSource

NONE = NO_CAUSE
BOUNDED = ObjectiveSet(ttft=0.5, tpot=0.05, max_gap=1.0, no_stalls=True, duration=30.0)


def stats(
    *,
    outcome: Outcome = Outcome.OK,
    status: int = 200,
    duration: float = 3.0,
    ttft: float | None = 0.2,
    tpot: float | None = 0.02,
    itl_max: float = 0.1,
    itl_count: float = 99.0,
    stalls: int = 0,
    model: str | None = "llama",
    operation: str = "chat",
) -> RequestStats:
    return RequestStats(
        operation, model, outcome, status, True, duration, ttft, tpot, 10, 100,
        TokenSource.USAGE, 100, itl_count, 2.0, 0.04, itl_max, stalls, 1.0,
    )  # fmt: skip


def test_a_request_within_every_bound_is_good() -> None:
    assert judge(BOUNDED, stats()) == GOOD


@pytest.mark.parametrize(
    ("changes", "missed", "causes"),
    [
        ({"ttft": 0.51}, (Objective.TTFT,), (NONE,)),
        ({"tpot": 0.06}, (Objective.TPOT,), (NONE,)),
        ({"itl_max": 1.5}, (Objective.MAX_GAP,), (NONE,)),
        ({"stalls": 1}, (Objective.STALL,), ("unknown",)),  # a stall nobody judged
        ({"duration": 31.0}, (Objective.DURATION,), (NONE,)),
        # joint: every bound it missed, in the objectives' order
        (
            {"ttft": 2.0, "tpot": 0.2, "stalls": 3},
            (Objective.TTFT, Objective.TPOT, Objective.STALL),
            (NONE, NONE, "unknown"),
        ),
    ],
)
def test_each_bound_missed_is_named(
    changes: dict[str, float], missed: tuple[Objective], causes: tuple[str, ...]
) -> None:
    verdict = judge(BOUNDED, stats(**changes))  # type: ignore[arg-type]
    assert verdict == Verdict(False, missed, causes)


MS = 1_000_000


def test_each_miss_is_counted_under_its_cause() -> None:
    """A TTFT miss under the phase that took most of it; a gap or stall miss under the
    cause of the longest stall; the rest under none."""
    phases = TtftPhases(5 * MS, None, 700 * MS, 200 * MS, 10 * MS)
    stalls = (Stall(0, 90 * MS, StallCause.PREFILL), Stall(100 * MS, 400 * MS, StallCause.CLIENT),
              Stall(500 * MS, 700 * MS, StallCause.ENGINE_PAUSE))  # fmt: skip
    slow = stats(ttft=2.0, itl_max=1.5, stalls=3, tpot=0.2)
    verdict = judge(BOUNDED, slow, phases, stalls)
    assert verdict is not None
    assert dict(zip(verdict.missed, verdict.causes, strict=True)) == {
        Objective.TTFT: "queue", Objective.TPOT: NONE, Objective.MAX_GAP: "client",
        Objective.STALL: "client",
    }  # fmt: skip
    prefill = TtftPhases(5 * MS, 0, 300 * MS, 300 * MS, 300 * MS)  # equals: the first of them
    assert judge(BOUNDED, stats(ttft=2.0), prefill) == Verdict(False, (Objective.TTFT,), ("queue",))
    before = TtftPhases(900 * MS, None, None, None, 100 * MS)
    assert judge(BOUNDED, stats(ttft=2.0), before) == Verdict(
        False, (Objective.TTFT,), ("before_engine",))  # fmt: skip


def test_every_cause_a_miss_can_have_is_a_closed_set() -> None:
    assert miss_causes(Objective.TTFT) == (
        "before_engine", "load", "queue", "prefill", "other", "remote_prefill", "kv_transfer",
        "first_decode", NONE)  # fmt: skip
    assert miss_causes(Objective.STALL) == (
        "prefill", "preemption", "engine_pause", "client", "unknown")  # fmt: skip
    assert miss_causes(Objective.MAX_GAP) == (*miss_causes(Objective.STALL), NONE)
    assert miss_causes(Objective.TPOT) == miss_causes(Objective.ERROR) == (NONE,)


def test_a_bound_at_its_value_is_met() -> None:
    assert judge(BOUNDED, stats(ttft=0.5, tpot=0.05, itl_max=1.0, duration=30.0)) == GOOD


def test_what_a_request_did_not_measure_is_not_held_against_it() -> None:
    """No first token (an embeddings request, a JSON answer), one token (no TPOT), no gap:
    only the bounds it has a measure for apply."""
    no_tokens = stats(ttft=None, tpot=None, itl_count=0, itl_max=0.0)
    assert judge(BOUNDED, no_tokens) == GOOD
    assert judge(BOUNDED, stats(itl_count=0, itl_max=5.0)) == GOOD


@pytest.mark.parametrize(
    ("outcome", "status", "verdict"),
    [
        (Outcome.UPSTREAM_ERROR, 502, Verdict(False, (Objective.ERROR,), (NONE,))),
        (Outcome.UPSTREAM_TIMEOUT, 504, Verdict(False, (Objective.ERROR,), (NONE,))),
        (Outcome.SHUTDOWN, 200, Verdict(False, (Objective.ERROR,), (NONE,))),  # a stream cut short
        (Outcome.OK, 503, Verdict(False, (Objective.ERROR,), (NONE,))),
        (Outcome.CLIENT_DISCONNECT, 200, None),  # the user left: in neither series
        (Outcome.REJECTED, 413, None),  # the sidecar refused it
        (Outcome.OK, 404, None),  # the client's error
        (Outcome.OK, 429, None),
    ],
)
def test_which_outcomes_count(outcome: Outcome, status: int, verdict: Verdict | None) -> None:
    """A failure is bad whatever its timing; the user's own doing is judged in neither."""
    assert judge(BOUNDED, stats(outcome=outcome, status=status, ttft=9.0)) == verdict


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (500, Verdict(False, (Objective.ERROR,), (NONE,))),  # the first of the engine's failures
        (501, Verdict(False, (Objective.ERROR,), (NONE,))),
        (499, None),  # the last of the client's own
        (400, None),  # the first of them
        (401, None),
        (399, Verdict(False, (Objective.TTFT,), (NONE,))),  # not an error: judged on its timing
        (304, Verdict(False, (Objective.TTFT,), (NONE,))),
    ],
)
def test_each_status_class_starts_at_its_first_code(status: int, verdict: Verdict | None) -> None:
    """5xx is bad whatever its timing, 4xx in neither series, below 400 judged by its bounds."""
    assert judge(BOUNDED, stats(status=status, ttft=9.0)) == verdict


def test_the_default_set_is_an_availability_objective() -> None:
    default = ObjectiveSet()
    assert default.objectives == (Objective.ERROR,)
    assert judge(default, stats(ttft=60.0, duration=600.0, stalls=9)) == GOOD
    assert (default.target, default.window) == (0.999, 28 * 86400)
    assert BOUNDED.objectives == (
        Objective.TTFT, Objective.TPOT, Objective.MAX_GAP, Objective.STALL, Objective.DURATION,
        Objective.ERROR,
    )  # fmt: skip


def _timed(ttft: float | None, tpot: float | None) -> RequestStats:
    stats = RequestStats(
        "chat", "m", Outcome.OK, 200, True, 1.0, 0.1, 0.01, 5, 10, TokenSource.USAGE, 10,
        9.0, 0.09, 0.001, 0.02, 0, 1.0,
    )  # fmt: skip
    return stats._replace(ttft_s=ttft, tpot_s=tpot)


@pytest.mark.parametrize(
    ("bounds", "ttft", "tpot", "ratio"),
    [
        ((1.0, 0.05), 0.5, 0.01, 0.5),  # TTFT the nearer its bound
        ((1.0, 0.05), 0.2, 0.04, 0.8),  # TPOT the nearer
        ((1.0, None), 0.2, 0.04, 0.2),  # no TPOT bound: TTFT's alone
        ((None, 0.05), 0.2, 0.04, 0.8),
        ((1.0, 0.05), None, None, None),  # nothing measured: nothing to compare
        ((None, None), 0.2, 0.04, None),  # no latency bound
        ((2.0, 0.05), 3.0, None, 1.5),  # missed: above 1
    ],
)
def test_the_latency_ratio_is_the_nearer_bound(
    bounds: tuple[float | None, float | None], ttft: float | None, tpot: float | None,
    ratio: float | None,
) -> None:  # fmt: skip
    objectives = ObjectiveSet(ttft=bounds[0], tpot=bounds[1])
    found = latency_ratio(objectives, _timed(ttft, tpot))
    assert found == (pytest.approx(ratio) if ratio is not None else None)
