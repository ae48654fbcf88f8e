"""A level's figures from what its clients saw: quantiles, throughput, goodput, the verdict."""

from __future__ import annotations

import math

import pytest

from llmobs.tools.capacity.figures import Objectives, Sample, judge, level, quantiles


def steady(sent: float, ttft: float, gap: float, tokens: int) -> Sample:
    """A request with evenly spaced tokens, one a chunk."""
    times = tuple(sent + ttft + i * gap for i in range(tokens))
    return Sample(sent, times[-1] + 0.001, ttft, times, tokens)


def test_tpot_and_the_longest_gap_of_one_request() -> None:
    times = (1.2, 1.3, 1.4, 2.4, 2.5)
    sample = Sample(1.0, 2.6, 0.2, times, 5)
    assert sample.tpot == pytest.approx((2.5 - 1.2) / 4)
    assert sample.max_gap == pytest.approx(1.0)
    assert sample.value("ttft") == 0.2


def test_a_chunk_of_several_tokens_counts_them_in_tpot() -> None:
    sample = Sample(0.0, 1.0, 0.1, (0.1, 0.5), 9)  # the second chunk carries eight tokens
    assert sample.tpot == pytest.approx(0.4 / 8)


def test_a_failed_or_one_token_request_has_no_tpot() -> None:
    assert Sample(0, 1, None, (), 0, "HTTP 500").tpot is None
    assert Sample(0, 1, 0.1, (0.1,), 1).tpot is None
    assert Sample(0, 1, 0.1, (0.1,), 1).max_gap is None
    assert Sample(0, 1, 0.1, (0.1, 0.2), 2, "ClientPayloadError").value("ttft") is None


def test_quantiles_interpolate_as_numpy_does() -> None:
    found = quantiles([float(v) for v in range(1, 101)])
    assert found[0.5] == pytest.approx(50.5)
    assert found[0.9] == pytest.approx(90.1)
    assert found[0.99] == pytest.approx(99.01)
    assert quantiles([]) == {}


def test_the_quantile_of_each_bound_judges_the_level() -> None:
    fast = [steady(i, 0.1, 0.01, 10) for i in range(18)]
    slow = [steady(20 + i, 2.0, 0.01, 10) for i in range(2)]  # 10 %: p90 stays fast
    objectives = Objectives({"ttft": 1.0, "tpot": 0.02}, quantile=0.9)
    judged, missed = judge(fast + slow, objectives)
    assert missed == ()
    assert judged["ttft"] == pytest.approx(0.1 + 0.1 * 1.9)  # interpolated into the slow
    assert judge(fast + slow + slow, objectives)[1] == ("ttft",)
    assert judge(fast, Objectives({"tpot": 0.005}))[1] == ("tpot",)


def test_failures_beyond_the_quantile_s_allowance_miss_as_errors() -> None:
    ok = [steady(i, 0.1, 0.01, 10) for i in range(9)]
    failed = Sample(9, 9.5, None, (), 0, "HTTP 503")
    assert judge([*ok, failed], Objectives({"ttft": 1.0}, 0.9))[1] == ()
    assert judge([*ok, failed, failed], Objectives({"ttft": 1.0}, 0.9))[1] == ("errors",)


def test_a_closed_loop_s_throughput_by_little_s_law() -> None:
    # 4 clients in step: each cohort's requests end together, every 2 s: 2 requests/s
    samples = [Sample(c * 2.0, c * 2.0 + 2.0, 0.1, (0.1, 1.9), 20) for c in range(3)
               for _ in range(4)]  # fmt: skip
    lv = level(4, samples, Objectives({"ttft": 0.5}), clients=4)
    assert lv.throughput == pytest.approx(2.0)
    assert lv.output_tps == pytest.approx(40.0)


def test_throughput_and_goodput_over_the_ends_spacing() -> None:
    # ten requests ending one every 0.5 s, each 2 s long: 2 requests/s
    samples = [Sample(i * 0.5, i * 0.5 + 2.0, 0.1 + (i == 9), (0.1, 1.9), 20) for i in range(10)]
    lv = level(8, samples, Objectives({"ttft": 0.5}))
    assert lv.throughput == pytest.approx(2.0)
    assert lv.output_tps == pytest.approx(40.0)
    assert lv.goodput == pytest.approx(1.8)  # one in ten too slow
    assert lv.good_tps == pytest.approx(36.0)
    assert lv.good_share == pytest.approx(0.9)
    assert lv.seconds == pytest.approx(6.5)
    assert lv.requests == 10 and lv.errors == 0
    assert lv.holds


def test_an_empty_level_does_not_hold() -> None:
    lv = level(4, [], Objectives({"ttft": 1.0}))
    assert not lv.holds
    assert lv.throughput == 0 and lv.good_share == 0


def test_a_level_keeps_every_quantile_of_every_quantity() -> None:
    lv = level(2, [steady(i, 0.1, 0.02, 5) for i in range(4)], Objectives({"ttft": 1.0}))
    assert set(lv.quantiles) == {"ttft", "tpot", "max_gap"}
    assert lv.quantiles["tpot"][0.99] == pytest.approx(0.02)
    assert math.isclose(lv.judged["ttft"], 0.1)
