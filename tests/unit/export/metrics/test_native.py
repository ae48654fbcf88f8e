"""Native buckets: client_golang's keys, its resolution cap, its spans; the same
counts whichever way a window comes; a bounded size per series."""

from __future__ import annotations

import math
import random
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmobs.export.metrics.catalogue import LATENCY_NATIVE, SCORE_NATIVE
from llmobs.export.metrics.native import (
    ZERO_THRESHOLD,
    Layout,
    NativeBuckets,
    key,
    spans,
    upper,
)
from tests.support.strategies import FAST

positive = st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False)
schemas = st.integers(min_value=-4, max_value=8)


@FAST
@given(positive, schemas)
def test_a_value_falls_in_the_bucket_its_key_names(value: float, schema: int) -> None:
    k = key(value, schema)
    assert upper(k - 1, schema) < value <= upper(k, schema)


@FAST
@given(positive, schemas)
def test_the_key_is_the_spec_formula(value: float, schema: int) -> None:
    """``ceil(log2(v) * 2^schema)``, wherever floating point leaves no doubt."""
    exact = math.log2(value) * 2.0**schema
    if abs(exact - round(exact)) > 1e-6:
        assert key(value, schema) == math.ceil(exact)


def test_known_keys() -> None:
    assert key(1.0, 0) == 0 and key(2.0, 0) == 1 and key(2.1, 0) == 2
    assert key(1.0, 3) == 0 and key(0.5, 3) == -8 and key(1.0905, 3) == 1
    assert key(0.01, 5) == -212  # ceil(log2(0.01) * 32) = ceil(-212.6)
    assert key(1.0, -1) == 0 and key(4.0, -1) == 1 and key(4.1, -1) == 2
    assert key(math.inf, 3) == key(1.7976931348623157e308, 3) + 1
    assert key(-math.inf, 3) == key(math.inf, 3) and key(-0.5, 3) == key(0.5, 3)


def test_a_layout_outside_prometheus_schemas_is_refused() -> None:
    for layout in (Layout(9, 10), Layout(-5, 10), Layout(3, 0)):
        with pytest.raises(ValueError, match="layout"):
            NativeBuckets(layout)


def test_zero_and_nan() -> None:
    buckets = NativeBuckets(Layout(5, 10))
    for value in (0.0, ZERO_THRESHOLD, -ZERO_THRESHOLD, math.nan):
        buckets.add(value)
    assert buckets.zero == 3
    assert not buckets.positive and not buckets.negative
    buckets.add(-0.5, 2)
    assert buckets.negative == {key(0.5, 5): 2}


@FAST
@given(st.lists(positive, min_size=1, max_size=300), st.integers(min_value=1, max_value=40))
def test_the_limit_halves_the_resolution_as_client_golang_does(
    values: list[float], limit: int
) -> None:
    """Never more than ``limit`` buckets (unless at schema -4); no count lost; and the counts
    are those of the same values observed directly at the final schema."""
    buckets = NativeBuckets(Layout(5, limit))
    for value in values:
        buckets.add(value)
    assert len(buckets.positive) <= limit or buckets.schema == -4
    assert sum(buckets.positive.values()) == len(values)
    direct: dict[int, int] = {}
    for value in values:
        k = key(value, buckets.schema)
        direct[k] = direct.get(k, 0) + 1
    assert buckets.positive == direct


@FAST
@given(st.lists(st.floats(min_value=0.0, max_value=5.0), max_size=400), schemas)
def test_sorted_runs_and_numpy_count_as_one_by_one(values: list[float], schema: int) -> None:
    one = NativeBuckets(Layout(schema, 10_000))
    for value in values:
        one.add(value)
    runs = NativeBuckets(Layout(schema, 10_000))
    runs.add_sorted(sorted(values))
    array = NativeBuckets(Layout(schema, 10_000))
    array.add_array(np.array(values, dtype=np.float64))
    for other in (runs, array):
        assert (other.positive, other.zero, other.schema) == (one.positive, one.zero, schema)


def test_numpy_weights_count_each_value_that_many_times() -> None:
    rng = random.Random(7)
    values = [rng.uniform(0.001, 2.0) for _ in range(500)] + [0.0]
    weights = [float(rng.randint(1, 4)) for _ in values]
    one = NativeBuckets(LATENCY_NATIVE)
    for value, weight in zip(values, weights, strict=True):
        one.add(value, int(weight))
    array = NativeBuckets(LATENCY_NATIVE)
    array.add_array(np.array(values), np.array(weights))
    assert (array.positive, array.zero, array.schema) == (one.positive, one.zero, one.schema)


@FAST
@given(st.dictionaries(st.integers(min_value=-300, max_value=300), st.integers(1, 10**9)))
def test_spans_and_deltas_decode_to_the_buckets(buckets: dict[int, int]) -> None:
    found_spans, deltas = spans(buckets)
    decoded: dict[int, int] = {}
    index, count, i = 0, 0, 0
    for n, (offset, length) in enumerate(found_spans):
        index = offset if n == 0 else index + offset
        if n:
            assert offset > 2  # gaps of one or two buckets stay inside a span
        for _ in range(length):
            count += deltas[i]
            i += 1
            if count:
                decoded[index] = count
            index += 1
    assert i == len(deltas)
    assert decoded == buckets


def test_spans_fill_small_gaps_with_zeros() -> None:
    assert spans({-3: 1, -1: 2, 0: 1, 5: 4}) == ([(-3, 4), (4, 1)], [1, -1, 2, -1, 3])


def test_a_full_series_stays_under_its_memory_bound() -> None:
    """The most a series holds: ``limit`` buckets, each a large key and a large count. The
    figure docs/metrics.md states (16 KiB for 160 buckets)."""
    for layout in (LATENCY_NATIVE, SCORE_NATIVE):
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        buckets = NativeBuckets(layout)
        for k in range(layout.limit):  # 160 distinct buckets, each count past the small ints
            buckets.add(upper(k - 400, layout.schema), 1000)
        size = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert len(buckets.positive) == layout.limit and buckets.schema == layout.schema
        assert size <= 16 * 1024, size


def test_the_largest_values_and_infinity_count_everywhere() -> None:
    """Values up to the largest float and infinity: every path counts them, none raises
    (a raise after the classic buckets were counted would leave the two disagreeing)."""
    values = [1.0, 1.65e308, 1.7976931348623157e308, math.inf]
    for layout in (Layout(3, 160), Layout(5, 160), Layout(0, 160), Layout(-2, 160)):
        one = NativeBuckets(layout)
        for value in values:
            one.add(value)
        runs = NativeBuckets(layout)
        runs.add_sorted(values)
        array = NativeBuckets(layout)
        array.add_array(np.array(values))
        assert one.positive == runs.positive == array.positive
        assert sum(one.positive.values()) == len(values)
