"""Both reports as people and tools read them: ``llmobs slo``'s tables and JSON, ``llmobs
why``'s shares in words (pure: the rows given)."""

from __future__ import annotations

import json

from llmobs.tools.slo.attainment import Breakdown, Row
from llmobs.tools.slo.reasons import ALL, Why
from llmobs.tools.slo.render import (
    PHASE_WORDS,
    STALL_WORDS,
    breakdown_table,
    shares,
    slo_json,
    slo_table,
    why_json,
    why_text,
)

CHAT = ("chat", "m", "")
SPLIT: Breakdown = {
    (CHAT, "a"): Row(good=90.0, bad=10.0, misses={"ttft": 10.0}),
    (CHAT, "c"): Row(good=1.0, bad=30.0, misses={"error": 30.0}),
}


def test_the_slo_table_one_line_a_label_set() -> None:
    rows = {
        CHAT: Row(good=6.0, bad=3.0, good_tokens=48.0, tokens=68.0, target=0.9,
                  misses={"error": 1.0, "ttft": 2.0, "zzz": 0.0}),
        ("chat", "idle", ""): Row(good=1.0),
    }  # fmt: skip
    assert slo_table(rows).splitlines() == [
        "operation  model  judged  good  attainment  target   met  good tokens  misses",
        "chat       idle   1       1     100.000%    -        yes  -            -",
        "chat       m      9       6     66.667%     90.000%  NO   48/68        ttft 2, error 1",
    ]
    # a target given holds every label set to it
    assert slo_table(rows, 0.5).splitlines()[2].split()[5:7] == ["50.000%", "yes"]


def test_a_tenant_column_when_tenants_are_labelled_a_cost_one_when_priced() -> None:
    rows = {("chat", "m", "team-a"): Row(good=1.0, bad=1.0, cost=0.75, bad_cost=0.5,
                                         currency="EUR")}  # fmt: skip
    header, line = slo_table(rows).splitlines()
    assert header.split()[:3] == ["operation", "model", "tenant"] and "cost (bad)" in header
    assert line.split()[2] == "team-a" and "0.75 (0.50) EUR" in line


def test_a_small_cost_is_shown_with_the_figures_it_needs_and_stays_a_number_for_tools() -> None:
    """A few requests' cost reads 0.00009 EUR, not 0.00 (issue 53)."""
    rows = {("chat", "m", ""): Row(good=2.0, bad=1.0, cost=9e-05, bad_cost=3e-05,
                                   currency="EUR")}  # fmt: skip
    assert "0.00009 (0.00003) EUR" in slo_table(rows).splitlines()[1]
    (found,) = json.loads(slo_json(rows))["label_sets"]
    assert (found["cost"], found["bad_cost"], found["currency"]) == (9e-05, 3e-05, "EUR")


def test_the_pods_that_hold_the_bad_requests_most_first() -> None:
    lines = breakdown_table(SPLIT, "pod").splitlines()
    assert lines[0].split() == ["operation", "model", "pod", "judged", "bad", "share", "bad",
                                "misses"]  # fmt: skip
    assert [line.split()[2:6] for line in lines[1:]] == [  # the most bad first, not by name
        ["c", "31", "30", "96.774%"], ["a", "100", "10", "10.000%"],
    ]  # fmt: skip
    assert lines[1].endswith("error 30") and lines[2].endswith("ttft 10")


def test_the_slo_report_for_tools() -> None:
    rows = {CHAT: Row(good=9.0, bad=1.0, target=0.95, misses={"ttft": 1.0})}
    report = json.loads(slo_json(rows, breakdown=("pod", SPLIT)))
    assert (report["passed"], report["outcome"]) == (False, "missed")
    assert report["label_sets"] == [{
        "operation": "chat", "model": "m", "judged": 10.0, "good": 9.0, "bad": 1.0,
        "attainment": 0.9, "target": 0.95, "met": False, "good_output_tokens": 0.0,
        "output_tokens": 0.0, "misses": {"ttft": 1.0},
    }]  # fmt: skip
    assert report["misses_by"]["label"] == "pod"
    assert [s["pod"] for s in report["misses_by"]["label_sets"]] == ["a", "c"]
    unjudged = json.loads(slo_json({}, None, "nothing judged"))
    assert unjudged == {"passed": False, "outcome": "unjudged", "error": "nothing judged",
                        "label_sets": []}  # fmt: skip


WHY = {
    ALL: Why(ttft_misses={"queue": 71.0, "prefill": 22.0, "before_engine": 7.0},
             stalls={"prefill": 64.0, "engine_pause": 30.0, "client": 6.0},
             ttft_seconds={"queue": 3.0, "other": 1.0}),
    ("chat", "qwen"): Why(stalls={"engine_pause": 30.0}),
    ("chat", "llama"): Why(gap_misses={"client": 4.0}),
}  # fmt: skip


def test_shares_read_as_the_issue_asks() -> None:
    assert shares(WHY[ALL].ttft_misses, PHASE_WORDS) == (
        "71% queue, 22% prefill, 7% before the engine")  # fmt: skip
    assert shares(WHY[ALL].stalls, STALL_WORDS) == (
        "64% prefill interference, 30% engine pauses, 6% client")  # fmt: skip
    assert shares({}, STALL_WORDS) == "-"
    assert shares({"client": 1.0, "prefill": 1.0}, STALL_WORDS) == (
        "50% prefill interference, 50% client")  # ties in the causes' order  # fmt: skip
    assert shares({"new_cause": 1.0}, STALL_WORDS) == "100% new_cause"  # a cause not yet worded
    # a share that rounds to nothing is still something (issue 53: small numbers readable)
    assert shares({"queue": 996.0, "other": 4.0}, PHASE_WORDS) == "100% queue, <1% other"
    assert shares({"queue": 99.0, "other": 1.0}, PHASE_WORDS) == "99% queue, 1% other"


def test_the_why_report_for_people_and_for_tools() -> None:
    text = why_text(WHY)
    assert text.splitlines()[:5] == [
        "all requests:",
        "  TTFT misses (100): 71% queue, 22% prefill, 7% before the engine",
        "  gap and stall misses (0): -",
        "  stalls (100): 64% prefill interference, 30% engine pauses, 6% client",
        "  TTFT spent in (4 s): 75% queue, 25% other",
    ]
    assert text.index("chat llama:") < text.index("chat qwen:")
    report = json.loads(why_json(WHY))
    assert [(s["operation"], s["model"]) for s in report["label_sets"]] == [
        ("all", "all"), ("chat", "llama"), ("chat", "qwen"),
    ]  # fmt: skip
    assert report["label_sets"][0]["stalls"]["prefill"] == 64.0 and "error" not in report
    assert json.loads(why_json({}, "nothing"))["error"] == "nothing"
