"""The families' layout behind their handles (``metrics.series``): a row of histograms bound
to one label set observes as the families do, binds each series at its first observation
(the order /metrics lists them in), and skips what was not measured."""

from __future__ import annotations

from bisect import bisect_left

from llmobs.export.metrics.catalogue import (
    CAUSE,
    DURATION,
    MODEL,
    STALLS,
    TOKEN_TYPE,
    TOKEN_USAGE,
    TTFT,
)
from llmobs.export.metrics.series import CounterFamily, HistogramFamily, HistogramRow
from tests.support.recording import observe


def _families() -> tuple[HistogramFamily, HistogramFamily, HistogramFamily]:
    return HistogramFamily(DURATION), HistogramFamily(TTFT), HistogramFamily(TOKEN_USAGE)


def test_a_row_observes_what_the_families_observe() -> None:
    duration, ttft, usage = _families()
    row = HistogramRow(
        [(duration, ("chat", "m")), (ttft, ("chat", "m")), (usage, ("chat", "m", "input")),
         (usage, ("chat", "m", "output"))]
    )  # fmt: skip
    plain = _families()
    rows = [(0.7, 0.05, 12, 30), (2.5, None, 3, None), (0.2, 0.2, None, 1)]
    for values in rows:
        row.observe_all(values)
        for family, key, value in zip(
            (plain[0], plain[1], plain[2], plain[2]),
            (("chat", "m"), ("chat", "m"), ("chat", "m", "input"), ("chat", "m", "output")),
            values,
            strict=True,
        ):
            if value is not None:
                observe(family, key, value)
    for mine, theirs in zip((duration, ttft, usage), plain, strict=True):
        assert mine.series == theirs.series
    # spot-check the layout itself: bucket counts, then the sum
    series = duration.series[("chat", "m")]
    assert series[-1] == 0.7 + 2.5 + 0.2
    assert series[bisect_left(duration.bounds, 2.5)] == 1
    assert sum(series[:-1]) == 3


def test_series_are_bound_at_their_first_observation_in_that_order() -> None:
    duration, ttft, usage = _families()
    row = HistogramRow(
        [(duration, ("chat", "m")), (usage, ("chat", "m", "input")),
         (usage, ("chat", "m", "output"))]
    )  # fmt: skip
    row.observe_all((None, None, 5))  # output tokens first, nothing else measured
    assert list(usage.series) == [("chat", "m", "output")]
    assert not duration.series
    row.observe_all((1.0, 7))  # a shorter row: the rest not observed
    assert list(usage.series) == [("chat", "m", "output"), ("chat", "m", "input")]
    assert list(duration.series) == [("chat", "m")]
    assert not ttft.series


def test_a_row_shares_series_with_other_recorders_of_its_label_set() -> None:
    (duration, _, _) = _families()
    observe(duration, ("chat", "m"), 1.0)  # e.g. recorded before the row was made
    row = HistogramRow([(duration, ("chat", "m"))])
    row.observe_all((2.0,))
    series = duration.series[("chat", "m")]
    assert sum(series[:-1]) == 2
    assert series[-1] == 3.0


def test_families_add_up_their_series_by_the_labels_named() -> None:
    """A reader of totals names labels, not positions: the series of each value of those
    labels added up, a histogram's buckets and sum, a counter's value."""
    usage = HistogramFamily(TOKEN_USAGE)  # (operation, model, provider, token type)
    for key, value in ((("chat", "a", "vllm", "input"), 12.0),
                       (("chat", "a", "vllm", "output"), 3.0),
                       (("text_completion", "a", "vllm", "output"), 5.0),
                       (("chat", "b", "vllm", "output"), 300.0)):  # fmt: skip
        observe(usage, key, value)
    by_model = usage.sum_by((MODEL,))
    assert list(by_model) == [("a",), ("b",)]
    assert by_model[("a",)][usage.size] == 20.0  # the sum
    assert sum(by_model[("a",)][: usage.size]) == 3  # the counts
    by_type = usage.sum_by((MODEL, TOKEN_TYPE))
    assert {k: v[usage.size] for k, v in by_type.items()} == {
        ("a", "input"): 12.0, ("a", "output"): 8.0, ("b", "output"): 300.0,
    }  # fmt: skip
    stalls = CounterFamily(STALLS)  # (operation, model, cause)
    stalls.add(("chat", "a", "prefill"), 2)
    stalls.add(("text_completion", "a", "prefill"), 1)
    stalls.add(("chat", "a", "client"), 4)
    assert stalls.sum_by((CAUSE,)) == {("prefill",): 3, ("client",): 4}
    assert stalls.sum_by(()) == {(): 7}
