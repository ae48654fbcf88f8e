"""``llmobs slo``'s figures: samples in, a row per label set out, and with ``--by`` the rows
split by a target label, to say which pods hold the bad requests (pure: the samples given)."""

from __future__ import annotations

import math

from llmobs.tools.slo.attainment import (
    FAMILIES,
    Row,
    breakdown,
    outcome,
    passed,
    queries,
    rows_from_metrics,
    rows_from_samples,
)
from llmobs.tools.slo.samples import Sample

REQUESTS, TOKENS, MISSES = (
    "llmobs_slo_requests_total", "llmobs_slo_output_tokens_total", "llmobs_slo_misses_total",
)  # fmt: skip
TARGET, COST = "llmobs_slo_target", "llmobs_cost_total"
CHAT = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "m"}


def sample(pod: str, **labels: str) -> dict[str, str]:
    return {**CHAT, "pod": pod, **labels}


PODS: list[Sample] = [
    (REQUESTS, sample("a", verdict="good"), 90.0), (REQUESTS, sample("a", verdict="bad"), 10.0),
    (REQUESTS, sample("b", verdict="good"), 50.0), (REQUESTS, sample("b", verdict="bad"), 0.0),
    (REQUESTS, sample("c", verdict="good"), 1.0), (REQUESTS, sample("c", verdict="bad"), 30.0),
    (MISSES, sample("a", objective="ttft"), 10.0), (MISSES, sample("c", objective="error"), 30.0),
]  # fmt: skip


def test_each_family_goes_to_its_part_of_the_row() -> None:
    samples: list[Sample] = [
        (REQUESTS, {**CHAT, "verdict": "good"}, 6.0), (REQUESTS, {**CHAT, "verdict": "bad"}, 3.0),
        (TOKENS, {**CHAT, "verdict": "good"}, 48.0), (TOKENS, {**CHAT, "verdict": "bad"}, 20.0),
        (MISSES, {**CHAT, "objective": "ttft"}, 2.0), (MISSES, {**CHAT, "objective": "ttft"}, 1.0),
        (MISSES, {**CHAT, "objective": "error"}, 1.0),
        (TARGET, CHAT, 0.9), (TARGET, CHAT, 0.99), (TARGET, CHAT, 0.5),  # the strictest
        (COST, {**CHAT, "verdict": "good", "currency": "EUR"}, 0.25),
        (COST, {**CHAT, "verdict": "bad", "currency": "EUR"}, 0.5),
        (REQUESTS, {**CHAT, "verdict": "good"}, math.inf), (TOKENS, CHAT, math.nan),  # nothing
        ("llmobs_requests_total", CHAT, 100.0),  # another family: ignored
    ]  # fmt: skip
    assert rows_from_samples(samples) == {
        ("chat", "m", ""): Row(good=6.0, bad=3.0, good_tokens=48.0, tokens=68.0, target=0.99,
                               misses={"ttft": 3.0, "error": 1.0}, cost=0.75, bad_cost=0.5,
                               currency="EUR")
    }  # fmt: skip


def test_only_label_sets_with_requests_judged_are_rows() -> None:
    tenant = {**CHAT, "tenant": "team-a"}
    samples: list[Sample] = [
        (TARGET, {**CHAT, "gen_ai_request_model": "idle"}, 0.9),  # exported, nothing judged
        (REQUESTS, {**tenant, "verdict": "bad"}, 1.0),
    ]
    assert list(rows_from_samples(samples)) == [("chat", "m", "team-a")]


def test_a_row_meets_its_target_or_the_one_given() -> None:
    row = Row(good=9.0, bad=1.0, target=0.95)
    assert row.judged == 10.0 and row.attainment == 0.9
    assert not row.met() and row.met(0.9) and not row.met(0.91)
    assert Row(target=0.99).met()  # nothing judged: nothing missed
    assert Row(good=1.0).met()  # no target exported, none given
    rows = {("chat", "m", ""): row}
    assert (passed(rows), outcome(rows)) == (False, "missed")
    assert (passed(rows, 0.5), outcome(rows, 0.5)) == (True, "met")
    assert (passed({}), outcome({})) == (False, "unjudged")  # a gate never passes on nothing


def test_the_pods_that_hold_the_bad_requests() -> None:
    split = breakdown(PODS, ("pod",))
    assert {where: (row.judged, row.bad) for (_, where), row in split.items()} == {
        "a": (100, 10),
        "c": (31, 30),
    }  # b had none bad: not listed
    assert split[(("chat", "m", ""), "c")].misses == {"error": 30.0}
    # the rows are the breakdown's sums
    assert rows_from_samples(PODS)[("chat", "m", "")] == Row(
        good=141.0, bad=40.0, misses={"ttft": 10.0, "error": 30.0}
    )


def test_a_pod_is_its_namespace_and_name() -> None:
    """Pods of one name in two namespaces stay apart."""
    samples: list[Sample] = [(REQUESTS, sample("a", namespace=ns, verdict="bad"), 1.0)
                             for ns in "xy"]  # fmt: skip
    split = breakdown(samples, ("namespace", "pod"))
    assert sorted(where for _, where in split) == ["x/a", "y/a"]


def test_the_queries_ask_for_the_families_read_off_a_sidecar() -> None:
    asked = queries("5m", ("pod",))
    assert set(asked) == FAMILIES
    assert asked[REQUESTS] == (
        "sum by (gen_ai_operation_name, gen_ai_request_model, tenant, pod, verdict) "
        "(increase(llmobs_slo_requests_total[5m]))"
    )
    assert asked[TARGET] == (
        "max by (gen_ai_operation_name, gen_ai_request_model, tenant, pod) "
        "(max_over_time(llmobs_slo_target[5m]))"
    )


def test_the_rows_of_a_sidecars_page() -> None:
    text = (
        "# TYPE llmobs_slo_requests counter\n"
        'llmobs_slo_requests_total{gen_ai_operation_name="chat",gen_ai_request_model="m",'
        'verdict="good"} 2.0\n'
        "# TYPE llmobs_slo_target gauge\n"
        'llmobs_slo_target{gen_ai_operation_name="chat",gen_ai_request_model="m"} 0.9\n'
    )
    assert rows_from_metrics(text) == {("chat", "m", ""): Row(good=2.0, target=0.9)}
