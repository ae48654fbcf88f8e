"""Service-level objectives (``llmobs.observe.slo``): each request judged jointly against its set's
bounds, which outcomes count, which set a request of a model and operation gets, the objectives
file and its errors, and the settings that declare the default set."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmobs.config.objectives import (
    Objective,
    Objectives,
    ObjectiveSet,
    build_objectives,
    describe,
    load_overrides,
)
from llmobs.config.options import parse_duration
from llmobs.config.settings import ConfigError, Settings
from llmobs.observe.causes import Stall, StallCause
from llmobs.observe.phases import TtftPhases
from llmobs.observe.slo import GOOD, NO_CAUSE, Verdict, judge, miss_causes
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
        "before_engine", "load", "queue", "prefill", "other", NONE)  # fmt: skip
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


def test_the_most_specific_set_judges_a_request() -> None:
    default = ObjectiveSet(ttft=1.0)
    by_pair, by_model, by_op = (ObjectiveSet(ttft=t) for t in (0.1, 0.2, 0.3))
    objectives = Objectives(
        default,
        {("chat", "llama", None): by_pair, (None, "llama", None): by_model,
         ("text_completion", None, None): by_op},
    )  # fmt: skip
    assert objectives.for_request("chat", "llama") is by_pair
    assert objectives.for_request("text_completion", "llama") is by_model
    assert objectives.for_request("text_completion", "qwen") is by_op
    assert objectives.for_request("chat", "qwen") is default
    assert objectives.for_request("chat", None) is default
    assert Objectives(default).for_request("chat", "llama") is default


def test_a_tenants_set_comes_first() -> None:
    """A customer's objective is its contract: an entry naming the tenant wins over one
    naming the model; with the model too, over the tenant's alone."""
    default, a, a_llama, llama, chat_a = (ObjectiveSet(ttft=t) for t in (1, 2, 3, 4, 5))
    objectives = Objectives(default, {
        (None, None, "a"): a, (None, "llama", "a"): a_llama, (None, "llama", None): llama,
        ("chat", None, "a"): chat_a,
    })  # fmt: skip
    assert objectives.for_request("chat", "llama", "a") is a_llama
    assert objectives.for_request("chat", "qwen", "a") is chat_a
    assert objectives.for_request("text_completion", "qwen", "a") is a
    assert objectives.for_request("chat", "llama", "b") is llama
    assert objectives.for_request("chat", "llama") is llama
    assert objectives.for_request("chat", None, None) is default


def test_an_objectives_file_overrides_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(
        "objectives:\n"
        "  - model: llama\n    ttft: 500ms\n    tpot: 0.05\n    no_stalls: true\n"
        "  - operation: text_completion\n    duration: 1m\n    target: 0.99\n    window: 7d\n"
        "  - tenant: customer-a\n    ttft: 300ms\n    target: 0.995\n"
    )
    default = ObjectiveSet(ttft=2.0, max_gap=1.0)
    objectives = build_objectives(default, str(path))
    llama = objectives.for_request("chat", "llama")
    # what an entry leaves out is the default set's
    assert llama == ObjectiveSet(ttft=0.5, tpot=0.05, max_gap=1.0, no_stalls=True)
    text = objectives.for_request("text_completion", "qwen")
    assert text == ObjectiveSet(ttft=2.0, max_gap=1.0, duration=60.0, target=0.99, window=7 * 86400)
    assert objectives.windows == [7 * 86400, 28 * 86400]
    assert objectives.for_request("chat", "llama", "customer-a") == ObjectiveSet(
        ttft=0.3, max_gap=1.0, target=0.995)  # fmt: skip
    assert (
        describe(llama)
        == "ttft <= 0.5s, tpot <= 0.05s, max gap <= 1s, no stalls; 0.999 good over 28d"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("objectives: {}\n", "top-level list"),
        ("- model: a\n", "top-level list"),
        ("objectives:\n  - ttft: 1s\n", r"objectives\[0\]: name a model, an operation or a"),
        ("objectives:\n  - model: a\n    ttfb: 1s\n", "unknown field 'ttfb'"),
        ("objectives:\n  - model: a\n    ttft: soon\n", r"objectives\[0\]"),
        ("objectives:\n  - model: a\n    ttft: -1\n", "ttft: must be > 0"),
        ("objectives:\n  - model: a\n    target: 1\n", "target: must be above 0 and below 1"),
        ("objectives:\n  - model: a\n    target: '99%'\n", "target: expected a number"),
        ("objectives:\n  - model: a\n    no_stalls: 1\n", "no_stalls: expected true or false"),
        ("objectives:\n  - model: a\n    window: 5m\n", "window: must be at least 1h"),
        ("objectives:\n  - model: a\n  - model: a\n", r"objectives\[1\] repeats"),
        ("objectives: [\n", "slo.yaml"),
    ],
)
def test_a_bad_objectives_file_is_refused_with_where(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_overrides(path, ObjectiveSet())


def test_settings_declare_the_default_set_from_flags_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text("objectives:\n  - model: llama\n    ttft: 250ms\n")
    env = {"LLMOBS_SLO_TTFT": "2s", "LLMOBS_SLO_NO_STALLS": "true", "LLMOBS_SLO_FILE": str(path)}
    settings = Settings.from_sources(env, {"slo_tpot": 0.08, "slo_target": 0.99})
    objectives = settings.objectives()
    assert objectives.default == ObjectiveSet(ttft=2.0, tpot=0.08, no_stalls=True, target=0.99)
    assert objectives.for_request("chat", "llama").ttft == 0.25


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LLMOBS_SLO_TTFT": "0"}, "LLMOBS_SLO_TTFT"),
        ({"LLMOBS_SLO_TPOT": "fast"}, "LLMOBS_SLO_TPOT"),
        ({"LLMOBS_SLO_TARGET": "1.5"}, "LLMOBS_SLO_TARGET"),
        ({"LLMOBS_SLO_WINDOW": "10m"}, "LLMOBS_SLO_WINDOW"),
        ({"LLMOBS_TRACES_GOOD_RATIO": "2"}, "LLMOBS_TRACES_GOOD_RATIO"),
        ({"LLMOBS_SLO_FILE": "/nonexistent/slo.yaml"}, "slo.yaml"),
    ],
)
def test_bad_objectives_stop_the_start_up(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_sources(env)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("2s", 2.0), ("1.5", 1.5), ("5m", 300.0), ("6h", 21600.0),
     ("28d", 2419200.0), ("1w", 604800.0), (" 3 s ", 3.0)],
)  # fmt: skip
def test_durations_read_as_prometheus_spells_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ms", "soon", "inf", "nan s", "5 minutes"])
def test_what_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"convert|duration"):
        parse_duration(text)
