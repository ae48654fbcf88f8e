"""The baseline gate's figures: a run read off a sidecar's page, the noise band of the
baseline's runs, what is comparable, what regressed."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from llmobs.tools.slo.baseline import (
    FLOOR,
    Baseline,
    NotComparable,
    Run,
    band,
    bucket_width,
    check_comparable,
    compare,
    queries,
    run_of,
)
from llmobs.tools.slo.samples import page_samples
from tests.support.promql import metric_names

LABELS = 'gen_ai_operation_name="chat",gen_ai_request_model="m"'


def page(tpot_sum: float = 0.8, tpot_buckets: tuple[int, int, int] = (10, 36, 40),
         ok: int = 40, failed: int = 0, output: int = 1280, inputs: int = 2560,
         left: int = 0) -> str:  # fmt: skip
    """A sidecar's page after ``ok`` + ``failed`` requests (TPOT's buckets: <= 0.015,
    <= 0.025, +Inf), as its exposition writes it."""
    b = tpot_buckets
    return f"""# TYPE gen_ai_server_time_per_output_token_seconds histogram
gen_ai_server_time_per_output_token_seconds_bucket{{{LABELS},le="0.015"}} {b[0]}
gen_ai_server_time_per_output_token_seconds_bucket{{{LABELS},le="0.025"}} {b[1]}
gen_ai_server_time_per_output_token_seconds_bucket{{{LABELS},le="+Inf"}} {b[2]}
gen_ai_server_time_per_output_token_seconds_sum{{{LABELS}}} {tpot_sum}
gen_ai_server_time_per_output_token_seconds_count{{{LABELS}}} {b[2]}
# TYPE llmobs_requests_total counter
llmobs_requests_total{{{LABELS},outcome="ok"}} {ok}
llmobs_requests_total{{{LABELS},outcome="upstream_error"}} {failed}
llmobs_requests_total{{{LABELS},outcome="client_disconnect"}} {left}
# TYPE llmobs_tokens_total counter
llmobs_tokens_total{{{LABELS},gen_ai_token_type="output"}} {output}
llmobs_tokens_total{{{LABELS},gen_ai_token_type="input"}} {inputs}
"""


def run(**kwargs: Any) -> Run:
    samples, _ = page_samples(page(**kwargs), queries("1h").keys())
    return run_of(samples)


def test_a_run_read_off_a_page() -> None:
    r = run(failed=2)
    assert r.values["tpot_mean"] == pytest.approx(0.02)
    assert r.values["tpot_p90"] == pytest.approx(0.025)  # the 36th of 40: the second bucket's top
    assert r.values["error_share"] == pytest.approx(2 / 42)
    assert r.requests == 42 and r.models == ("m",)
    assert (r.input_tokens, r.output_tokens) == (64, 32)  # per request that ended well
    assert r.resolution["tpot_p90"] == pytest.approx(0.01)


def test_clients_that_left_are_neither_requests_nor_errors() -> None:
    r = run(failed=2, left=5)
    assert r.requests == 42
    assert r.values["error_share"] == pytest.approx(2 / 42)


def test_the_queries_are_promql_over_the_window() -> None:
    for name, query in queries("30m").items():
        assert "[30m]" in query and name.split("_bucket")[0] in query
        assert metric_names(query) == {name}, query


def test_a_page_with_no_request_is_not_a_run() -> None:
    with pytest.raises(NotComparable, match="no request counted"):
        run(ok=0)


def test_bucket_widths() -> None:
    cumulative = [(0.01, 1.0), (0.025, 5.0), (math.inf, 9.0)]
    assert bucket_width(cumulative, 0.005) == pytest.approx(0.01)
    assert bucket_width(cumulative, 0.02) == pytest.approx(0.015)
    assert bucket_width(cumulative, 0.05) == 0.0


def test_the_band_is_a_prediction_interval_of_the_runs() -> None:
    values = [1.00, 1.02, 0.98, 1.01, 0.99]
    b = band(values)
    sd = statistics.stdev(values)
    assert b.mean == pytest.approx(1.0)
    assert b.sd == pytest.approx(sd)
    assert b.upper == pytest.approx(1.0 + 7.173 * sd * math.sqrt(1.2))  # t(0.999, 4)
    # more runs, the same spread: a narrower band
    assert band(values * 2).upper < b.upper


def test_the_t_of_a_large_baseline_is_never_narrower_than_its_row() -> None:
    values = [1.0, 1.1] * 40  # 80 runs: between the rows for 60 and 120
    sd = statistics.stdev(values)
    assert band(values).upper == pytest.approx(1.05 + 3.232 * sd * math.sqrt(1 + 1 / 80))


def test_one_failed_request_is_not_a_trend() -> None:
    base = baseline_of(0.80, 0.801, 0.799)  # 40 requests a run, none failed
    one = {f.quantity: f for f in compare(base, run(failed=1))}["error_share"]
    assert not one.regressed  # 1 in 41: within one request of the smallest run
    two = {f.quantity: f for f in compare(base, run(failed=3))}["error_share"]
    assert two.regressed
    assert two.says().startswith("error_share 0.06977 is up from the baseline's 0")


def test_a_run_whose_requests_all_failed_regresses_rather_than_differs() -> None:
    base = baseline_of(0.80, 0.801, 0.799)
    failed = run(ok=0, failed=40, tpot_buckets=(0, 0, 0), tpot_sum=0, output=0, inputs=0)
    check_comparable(base, failed)
    assert {f.quantity for f in compare(base, failed) if f.regressed} == {"error_share"}


def test_runs_that_do_not_vary_get_the_floor_or_the_bucket() -> None:
    assert band([2.0, 2.0, 2.0]).upper == pytest.approx(2.0 * (1 + FLOOR))
    assert band([0.02] * 3, "tpot_p90", resolution=0.005).upper == pytest.approx(0.025)
    assert band([0.0] * 3, "error_share").upper == pytest.approx(0.01)
    assert math.isinf(band([1.0]).upper)


def baseline_of(*tpot_sums: float) -> Baseline:
    return Baseline([run(tpot_sum=s) for s in tpot_sums])


def test_a_slower_run_regresses_and_says_by_how_much() -> None:
    base = baseline_of(0.800, 0.802, 0.798, 0.801, 0.799)
    check_comparable(base, run(tpot_sum=0.88))
    found = {f.quantity: f for f in compare(base, run(tpot_sum=0.88))}
    assert found["tpot_mean"].regressed
    assert found["tpot_mean"].change == pytest.approx(0.10)
    assert found["tpot_mean"].says().startswith("tpot_mean 0.022 s is +10.0% from the baseline")
    assert not found["tpot_p90"].regressed  # the same bucket: not resolved
    assert not found["error_share"].regressed
    within = compare(base, run(tpot_sum=0.805))
    assert not any(f.regressed for f in within)
    # the same 10 % against runs that vary by 1 %: within their noise
    noisy = baseline_of(0.80, 0.81, 0.79, 0.80)
    assert not any(f.regressed for f in compare(noisy, run(tpot_sum=0.88)))


def test_a_faster_run_never_regresses() -> None:
    base = baseline_of(0.80, 0.81, 0.79)
    assert not any(f.regressed for f in compare(base, run(tpot_sum=0.5)))


def test_what_is_not_comparable() -> None:
    base = baseline_of(0.80, 0.81, 0.79)
    with pytest.raises(NotComparable, match="needs 3 at least"):
        check_comparable(baseline_of(0.8, 0.8), run())
    with pytest.raises(NotComparable, match="too few to compare"):
        check_comparable(base, run(ok=15, tpot_buckets=(4, 14, 15), output=480, inputs=960))
    with pytest.raises(NotComparable, match=r"64\.0 output tokens per request, the baseline.s 32"):
        check_comparable(base, run(output=2560))
    with pytest.raises(NotComparable, match=r"128\.0 input tokens"):
        check_comparable(base, run(inputs=5120))
    check_comparable(base, run(output=1300))  # within 5 %: the same workload


def test_the_file_keeps_every_run() -> None:
    base = baseline_of(0.80, 0.81, 0.79)
    again = Baseline.from_json(base.to_json())
    assert again.runs == base.runs
    with pytest.raises(ValueError, match="not an llmobs-baseline"):
        Baseline.from_json('{"kind": "llmobs-capacity"}')
    with pytest.raises(ValueError, match="lacks"):
        Baseline.from_json('{"kind": "llmobs-baseline", "runs": [{"values": {}}]}')
