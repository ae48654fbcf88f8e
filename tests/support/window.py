"""A window's classic buckets added into a series, as the ITL histogram adds them
(``export.metrics.series.TokenHistogram``): the tests of a window's binning read it so."""

from __future__ import annotations

from collections.abc import Sequence

from llmobs.observe.window import FloatArray, TokenWindow


def fill_classic(
    window: TokenWindow, bounds: Sequence[float], bounds_array: FloatArray, series: list[float]
) -> None:
    """Add ``window``'s count in each bucket of ``bounds`` to ``series`` (one per bucket,
    +Inf's last), checking that it names each bucket once at most."""
    binned = window.classic_counts(bounds, bounds_array)
    buckets = [bucket for bucket, _ in binned]
    assert len(set(buckets)) == len(buckets), binned
    for bucket, count in binned:
        assert type(count) is float, binned
        series[bucket] += count
