"""A registry read as PromQL would (``export.metrics.query``): sums of the samples whose
labels match, a histogram's cumulative buckets summed over its series, and
``histogram_quantile``'s interpolation, with the cases Prometheus answers specially (no
observations, a rank in the +Inf bucket, an empty bucket at the rank). The demo's summary and
the live page's quantiles read through it."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from llmobs.export.metrics.query import buckets, quantile, total

INF = math.inf


def registry() -> CollectorRegistry:
    """Things of two kinds, and waits of two models in two buckets and +Inf."""
    found = CollectorRegistry()
    things = Counter("t_things", "Things.", ["kind", "zone"], registry=found)
    things.labels("a", "x").inc(3)
    things.labels("a", "y").inc(1)
    things.labels("b", "x").inc(2)
    waits = Histogram("t_wait_seconds", "Wait.", ["model"], buckets=(0.1, 1.0), registry=found)
    for model, value in (("m1", 0.05), ("m1", 0.5), ("m2", 2.0), ("m2", 0.1)):
        waits.labels(model).observe(value)
    return found


def test_total_sums_the_samples_whose_labels_match() -> None:
    found = registry()
    assert total(found, "t_things_total") == 6
    assert total(found, "t_things_total", kind="a") == 4
    assert total(found, "t_things_total", kind="a", zone="x") == 3
    assert total(found, "t_things_total", kind="c") == 0.0
    assert total(found, "t_things_total", model="m1") == 0.0  # a label it does not have
    assert total(found, "t_things") == 0.0  # the sample's name, not the family's
    assert total(found, "t_wait_seconds_count", model="m2") == 2


def test_buckets_are_cumulative_and_summed_over_the_series() -> None:
    found = registry()
    assert buckets(found, "t_wait_seconds") == [(0.1, 2.0), (1.0, 3.0), (INF, 4.0)]
    assert buckets(found, "t_wait_seconds", model="m2") == [(0.1, 1.0), (1.0, 1.0), (INF, 2.0)]
    assert buckets(found, "t_wait_seconds", model="m3") == []
    assert buckets(found, "t_things") == []  # not a histogram


@pytest.mark.parametrize(
    ("q", "cumulative", "expected"),
    [
        # inside a bucket: linear from its lower bound (0 for the first) to its upper one
        (0.5, [(0.1, 2.0), (1.0, 4.0), (INF, 4.0)], 0.1),
        (0.75, [(0.1, 2.0), (1.0, 4.0), (INF, 4.0)], 0.55),
        (0.25, [(0.1, 2.0), (1.0, 4.0), (INF, 4.0)], 0.05),
        (1.0, [(0.1, 2.0), (1.0, 4.0), (INF, 4.0)], 1.0),
        # the rank in the +Inf bucket: the last finite bound, as Prometheus answers
        (0.99, [(0.1, 1.0), (INF, 2.0)], 0.1),
        (0.99, [(INF, 5.0)], 0.0),
        # a bucket as full as the one before it holds the rank at its bound
        (0.0, [(0.1, 0.0), (1.0, 0.0), (2.0, 4.0)], 0.1),
        # a quantile past 1 ranks past every bucket: the last bound, +Inf with one
        (1.5, [(0.1, 2.0), (1.0, 4.0), (INF, 4.0)], INF),
        (1.5, [(0.1, 2.0), (1.0, 4.0)], 1.0),
    ],
)  # fmt: skip
def test_quantile_interpolates_as_histogram_quantile(
    q: float, cumulative: list[tuple[float, float]], expected: float
) -> None:
    assert quantile(q, cumulative) == pytest.approx(expected)


@pytest.mark.parametrize("cumulative", [[], [(0.1, 0.0), (INF, 0.0)]])
def test_no_observations_have_no_quantile(cumulative: list[tuple[float, float]]) -> None:
    assert quantile(0.5, cumulative) is None


def test_quantile_of_a_registry_s_buckets() -> None:
    """The two read together, as the demo does: four waits, the median in (0.1, 1.0]."""
    assert quantile(0.5, buckets(registry(), "t_wait_seconds")) == pytest.approx(0.1)
    assert quantile(0.625, buckets(registry(), "t_wait_seconds")) == pytest.approx(0.55)
