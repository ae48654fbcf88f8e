"""A window of per-token ITLs (``window.ListWindow``, ``window.ArrayWindow``): its fields as
numpy arrays whichever kind it is, and how it fills a classic histogram's buckets and a native
histogram's. Each ITL goes to the bucket of the first bound at or above it (Prometheus' ``le``),
as many times as its chunk carried tokens: the same for either kind of window, and whether its
ITLs come sorted (one token a chunk) or with their counts."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from llmobs.observe.window import EMPTY_WINDOW, ArrayWindow, ListWindow, TokenWindow
from tests.support.strategies import FAST
from tests.support.window import fill_classic

BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]  # the +Inf bucket is left implicit


def make(
    kind: str, values: list[float], counts: list[float] | None, sort: bool = True
) -> TokenWindow:
    """A window of ``values``, a list or array by ``kind``; with ``sort``, as the stats module
    makes one: its ITLs also in ascending order (``ordered``) when each is observed once and
    there are any."""
    ordered = sorted(values) if sort and counts is None and values else None
    if kind == "list":
        return ListWindow(values, counts, 0, None, ordered=ordered)
    return ArrayWindow(
        np.array(values, dtype=np.float64),
        None if counts is None else np.array(counts, dtype=np.float64),
        0,
        None,
        ordered=None if ordered is None else np.array(ordered, dtype=np.float64),
    )


def expected(values: list[float], counts: list[float] | None) -> list[float]:
    """The classic buckets, one value at a time: bucket ``b`` holds the values above
    ``BOUNDS[b - 1]`` and at most ``BOUNDS[b]``."""
    series = [0.0] * (len(BOUNDS) + 1)
    for i, value in enumerate(values):
        series[bisect_left(BOUNDS, value)] += 1.0 if counts is None else counts[i]
    return series


class Native:
    """A native histogram's side of ``fill_native``: how many times each value was added,
    whichever call added it; the calls' contracts (whole counts, ascending runs) asserted."""

    def __init__(self) -> None:
        self.seen: Counter[float] = Counter()

    def add(self, value: float, count: int = 1) -> None:
        assert isinstance(value, float) and isinstance(count, int)
        self.seen[value] += count

    def add_sorted(self, values: list[float]) -> None:
        assert isinstance(values, list) and values == sorted(values)
        self.seen.update(values)

    def add_array(
        self, values: npt.NDArray[np.float64], weights: npt.NDArray[np.float64] | None = None
    ) -> None:
        assert isinstance(values, np.ndarray)
        if weights is None:
            self.seen.update(values.tolist())
            return
        assert len(weights) == len(values) and all(w == round(w) for w in weights.tolist())
        for value, weight in zip(values.tolist(), weights.tolist(), strict=True):
            self.seen[value] += round(weight)


def observed(values: list[float], counts: list[float] | None) -> Counter[float]:
    seen: Counter[float] = Counter()
    for i, value in enumerate(values):
        seen[value] += 1 if counts is None else round(counts[i])
    return seen


KINDS = pytest.mark.parametrize("kind", ["list", "array"])
# ITLs at and around the bounds, below the first and past the last
values = st.lists(
    st.sampled_from([0.0, 0.001, 0.005, 0.0051, 0.01, 0.02, 0.025, 0.25, 0.3, 1.0, 1.5, 60.0])
    | st.floats(0.0, 2.0),
    max_size=40,
)


@FAST
@given(values, st.data())
@example([0.01, 0.01, 0.01, 0.3], None)  # a run of equal values, then a later bucket
@example([1.0, 2.0, 3.0], None)  # at the last bound, then past it only
@example([2.0, 3.0], None)  # all past the last bound: the +Inf bucket
@example([0.001, 0.002], None)  # all in the first bucket
def test_each_itl_fills_the_bucket_of_the_first_bound_at_or_above_it(
    values: list[float], data: st.DataObject | None
) -> None:
    counts = None
    if data is not None:
        drawn = data.draw(
            st.none() | st.lists(st.integers(1, 5), min_size=len(values), max_size=len(values))
        )
        counts = None if drawn is None else [float(c) for c in drawn]
    want = expected(values, counts)
    for kind in ("list", "array"):
        for sort in (True, False):  # binned a bucket at a time, or a value at a time
            window = make(kind, values, counts, sort)
            series = [0.0] * (len(BOUNDS) + 1)
            fill_classic(window, BOUNDS, np.array(BOUNDS), series)
            assert series == want, (kind, sort)
            native = Native()
            window.fill_native(native)
            assert native.seen == observed(values, counts), (kind, sort)


@KINDS
@pytest.mark.parametrize("sort", [True, False])
def test_buckets_add_to_what_a_series_holds(kind: str, sort: bool) -> None:
    series = [1.0] * (len(BOUNDS) + 1)
    fill_classic(make(kind, [5.0, 0.02, 0.02], None, sort), BOUNDS, np.array(BOUNDS), series)
    assert series == [1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0]
    series = [1.0] * (len(BOUNDS) + 1)
    fill_classic(make(kind, [0.02, 5.0], [3.0, 2.0]), BOUNDS, np.array(BOUNDS), series)
    assert series == [1.0, 1.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0]


@KINDS
def test_an_itl_of_several_tokens_reaches_a_native_histogram_with_its_count(kind: str) -> None:
    native = Native()
    make(kind, [0.02, 0.5], [3.0, 1.0]).fill_native(native)
    assert native.seen == Counter({0.02: 3, 0.5: 1})


def test_a_window_without_itls_fills_nothing() -> None:
    for window in (EMPTY_WINDOW, make("list", [], None), make("list", [], [])):
        series = [0.0] * (len(BOUNDS) + 1)
        fill_classic(window, BOUNDS, np.array(BOUNDS), series)
        assert series == [0.0] * (len(BOUNDS) + 1)
        native = Native()
        window.fill_native(native)
        assert not native.seen
    assert EMPTY_WINDOW.size == 0 and EMPTY_WINDOW.stalls == 0


def test_a_window_made_of_lists_gives_its_fields_as_arrays() -> None:
    window = ListWindow([0.125, 0.25], [2.0, 1.0], 0, None, 3.0, chunk_times=[0, 5, 9],
                        chunk_gaps=[0.25, 0.25])  # fmt: skip
    assert window.size == 2
    assert window.itl.dtype == np.float64 and window.itl.tolist() == [0.125, 0.25]
    assert window.weights.dtype == np.float64 and window.weights.tolist() == [2.0, 1.0]
    assert window.gaps.dtype == np.float64 and window.gaps.tolist() == [0.25, 0.25]
    assert window.times_ns.dtype == np.int64 and window.times_ns.tolist() == [0, 5, 9]


def test_a_window_of_whole_numbers_gives_float_arrays() -> None:
    window = ListWindow([1, 2], [3, 1], 0, None, chunk_gaps=[1, 2])
    assert window.itl.dtype == window.weights.dtype == window.gaps.dtype == np.float64


@KINDS
def test_counts_of_another_length_than_the_itls_are_refused(kind: str) -> None:
    window = make(kind, [0.02, 0.03], [2.0])
    with pytest.raises(ValueError, match=r"shorter|same length"):  # not cut to the shorter
        fill_classic(window, BOUNDS, np.array(BOUNDS), [0.0] * (len(BOUNDS) + 1))
    if kind == "list":  # an array window hands its arrays on whole (add_array)
        with pytest.raises(ValueError, match="shorter"):
            window.fill_native(Native())


def test_a_window_without_counts_or_chunks_gives_ones_and_empty_arrays() -> None:
    window = ListWindow([0.125, 0.25], None, 0, None)
    assert window.weights.dtype == np.float64 and window.weights.tolist() == [1.0, 1.0]
    assert window.gaps.dtype == np.float64 and window.gaps.tolist() == []
    assert window.times_ns.dtype == np.int64 and window.times_ns.tolist() == []


def test_a_window_of_arrays_gives_its_own_arrays() -> None:
    itl, times = np.array([0.25]), np.array([0, 7], dtype=np.int64)
    window = ArrayWindow(itl, None, 0, None, chunk_times=times, chunk_gaps=itl)
    assert window.itl is itl and window.gaps is itl and window.times_ns is times


def test_the_base_window_bins_nothing_itself() -> None:
    window = TokenWindow([0.1], None, 0, None)
    with pytest.raises(NotImplementedError):
        fill_classic(window, BOUNDS, np.array(BOUNDS), [0.0] * (len(BOUNDS) + 1))
    with pytest.raises(NotImplementedError):
        window.fill_native(Native())


@pytest.mark.parametrize("kind", ["list", "array"])
def test_an_empty_window_with_sorted_values_bins_into_nothing(kind: str) -> None:
    """Either kind of window, empty but marked sorted, leaves the buckets as they were."""
    empty: list[float] = []
    window = (
        ListWindow(empty, None, 0, None, ordered=empty)
        if kind == "list"
        else ArrayWindow(np.zeros(0), None, 0, None, ordered=np.zeros(0))
    )
    series = [1.0] * (len(BOUNDS) + 1)
    fill_classic(window, BOUNDS, np.asarray(BOUNDS), series)
    assert series == [1.0] * (len(BOUNDS) + 1)
