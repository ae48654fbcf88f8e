"""Service-level objectives as declared (``config.objectives``): which set a request of a
model, operation and tenant gets, the objectives file and its errors, and the settings that
declare the default set. Judging a request against its set: ``tests/unit/observe/test_slo.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmobs.config.objectives import (
    ObjectiveError,
    Objectives,
    ObjectiveSet,
    build_objectives,
    describe,
    load_overrides,
)
from llmobs.config.settings import ConfigError, Settings


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


def test_a_set_checks_its_own_fields() -> None:
    with pytest.raises(ObjectiveError) as caught:
        ObjectiveSet(tpot=0.0)
    assert (caught.value.field, str(caught.value)) == ("tpot", "tpot: " + caught.value.message)
    assert Objectives(ObjectiveSet()).windows == [28 * 86400]
