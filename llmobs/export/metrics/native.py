"""Native histograms: Prometheus' exponential buckets, kept as client_golang keeps them.

A native histogram of schema ``s`` has a bucket ``k`` for every integer ``k``, holding the
values in ``(2^((k-1)/2^s), 2^(k/2^s)]`` (each bucket ``2^(2^-s)`` times as wide as the one
below it: 9 % at schema 3, 4.4 % at 4, 2.2 % at 5), and one zero bucket for ``|v| <=`` the zero
threshold. Only buckets that were hit are kept (a dict: key -> count), so the histogram has no
range to tune, and a quantile read from it is off by at most one bucket's width, wherever it
falls: what classic buckets cannot promise (docs/metrics.md).

The rules are client_golang's (``prometheus/histogram.go``): the same key for a value
(``frexp``, then a search in the bounds of one octave), the same zero threshold, and the same
cap on the buckets kept: when a new bucket makes more than ``limit``, the schema drops by one
(each two neighbouring buckets merge into one twice as wide) until it fits. The resolution then
stays reduced: client_golang's behaviour with no reset interval, and a counter reset on every
limit would cost more to Prometheus' ``rate()`` than the coarser buckets do. So a series holds
at most ``limit`` buckets, whatever it is fed.

Pure: no I/O, no clock, no lock (the owner of a series holds its own).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from functools import cache
from math import frexp, inf, isnan, ldexp
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from llmobs.export.metrics.native_bounds import BOUNDS

FloatArray = npt.NDArray[np.float64]

# client_golang's DefNativeHistogramZeroThreshold (2^-128): only an exact zero, in effect.
ZERO_THRESHOLD = 2.0**-128
MIN_SCHEMA = -4  # the widest buckets Prometheus knows (a factor of 65536)
MAX_SCHEMA = 8  # the narrowest (a factor of 1.0027)
_LARGEST = 1.7976931348623157e308  # client_golang counts an infinity as this, one bucket up


class Layout(NamedTuple):
    """How one histogram family's native buckets start and how many it may keep."""

    schema: int
    limit: int  # the most populated buckets a series keeps, zero bucket aside


def bounds(schema: int) -> tuple[float, ...]:
    """The upper bounds of one octave's buckets as fractions in [0.5, 1) (``frexp``'s range):
    ``2^(j/2^schema) / 2`` for each of its ``2^schema`` buckets, to the bit as client_golang
    has them."""
    return BOUNDS[schema]


@cache
def _table(schema: int) -> FloatArray:
    return np.asarray(bounds(schema), dtype=np.float64)


def key(value: float, schema: int) -> int:
    """The index of the bucket ``|value|`` falls in, as client_golang reckons it (an infinite
    value one bucket past the largest float's)."""
    magnitude = abs(value)
    infinite = magnitude == inf
    frac, exp = frexp(_LARGEST if infinite else magnitude)
    if schema > 0:
        table = bounds(schema)
        found = bisect_left(table, frac) + (exp - 1) * len(table)
    else:
        found = exp - 1 if frac == 0.5 else exp
        found = (found + (1 << -schema) - 1) >> -schema
    return found + 1 if infinite else found


def upper(key: int, schema: int) -> float:
    """The upper bound of bucket ``key``, ``2^(key/2^schema)``, as ``key`` reckons it: a value
    at most this has a key at most ``key``."""
    if schema > 0:
        table = bounds(schema)
        return ldexp(table[key % len(table)], key // len(table) + 1)
    return ldexp(1.0, key << -schema)


class NativeBuckets:
    """One series' native buckets: schema, zero bucket, and key -> count of the positive and
    negative buckets that were hit (latencies and scores have only positive ones)."""

    # table, octave: the bounds of one octave at the current schema, and their number (0 at
    # schema <= 0): what a caller inlining ``add``'s usual case needs (``series.HistogramRow``)
    __slots__ = ("limit", "negative", "octave", "positive", "schema", "table", "zero")

    def __init__(self, layout: Layout) -> None:
        if not MIN_SCHEMA <= layout.schema <= MAX_SCHEMA or layout.limit < 1:
            raise ValueError(f"no such native histogram layout: {layout}")
        self.schema = layout.schema
        self.limit = layout.limit
        self.zero: int = 0
        self.positive: dict[int, int] = {}
        self.negative: dict[int, int] = {}
        self.table = bounds(self.schema) if self.schema > 0 else ()
        self.octave = len(self.table)

    def add(self, value: float, count: int = 1) -> None:
        """Count ``value`` ``count`` times."""
        if value > ZERO_THRESHOLD:
            if self.octave and value != inf:  # the usual case, inline
                frac, exp = frexp(value)
                k = bisect_left(self.table, frac) + (exp - 1) * self.octave
            else:
                k = key(value, self.schema)
            buckets = self.positive
        elif value < -ZERO_THRESHOLD:
            k = key(value, self.schema)
            buckets = self.negative
        elif isnan(value):  # counted in no bucket (its count and sum still show it)
            return
        else:
            self.zero += count
            return
        before = buckets.get(k)
        if before is None:
            buckets[k] = count
            if len(self.positive) + len(self.negative) > self.limit:
                self.reduce()
        else:
            buckets[k] = before + count

    def add_sorted(self, values: list[float]) -> None:
        """Count ascending ``values`` once each, a run of values in one bucket at a time (a
        steady stream's gaps fall in a few buckets). The per-token path: one ``frexp``, two
        bisections and a dict update per run, no call."""
        i, n = 0, len(values)
        table, octave, positive = self.table, self.octave, self.positive
        while i < n:
            value = values[i]
            if not (ZERO_THRESHOLD < value < inf and octave):  # zero, infinite, schema <= 0
                self.add(value)
                table, octave, positive = self.table, self.octave, self.positive
                i += 1
                continue
            frac, exp = frexp(value)
            j = bisect_left(table, frac)
            # the run: the values up to the bucket's upper bound, upper(k) (a spread-out
            # window's runs are mostly one value: look at the next before searching)
            if j < octave:
                top = ldexp(table[j], exp)
            else:  # 2^exp, or past the largest float: infinity's bucket is the next one
                top = ldexp(1.0, exp) if exp < 1024 else _LARGEST
            end = i + 1
            if end < n and values[end] <= top:
                end = bisect_right(values, top, end)
            k = j + (exp - 1) * octave
            before = positive.get(k)
            if before is not None:
                positive[k] = before + end - i
            else:
                positive[k] = end - i
                if len(positive) + len(self.negative) > self.limit:
                    self.reduce()
                    table, octave, positive = self.table, self.octave, self.positive
            i = end

    def add_keyed(self, keys: Iterable[int], counts: Iterable[int]) -> None:
        """Add counts of positive buckets already keyed at this series' schema (numpy's, for a
        large window), then reduce the resolution if they passed the limit."""
        buckets = self.positive
        for k, count in zip(keys, counts, strict=True):
            before = buckets.get(k)
            buckets[k] = count if before is None else before + count
        if len(buckets) + len(self.negative) > self.limit:
            self.reduce()

    def add_array(self, values: FloatArray, weights: FloatArray | None = None) -> None:
        """Count each of ``values`` (``weights[i]`` times, whole numbers): numpy keys them all
        at once (a large window's)."""
        usual = (values > ZERO_THRESHOLD) & (values < inf)  # NaN is neither
        if not usual.all():
            rest = ~usual
            others = weights[rest].tolist() if weights is not None else None
            for i, value in enumerate(values[rest].tolist()):
                self.add(value, 1 if others is None else round(others[i]))
            values = values[usual]
            weights = weights[usual] if weights is not None else None
        if not len(values):
            return
        frac, exp = np.frexp(values)
        if self.schema > 0:
            keys = np.searchsorted(_table(self.schema), frac, side="left")
            keys += (exp - 1) * self.octave
        else:
            keys = exp - (frac == 0.5)
            keys = (keys + ((1 << -self.schema) - 1)) >> -self.schema
        found, index = np.unique(keys, return_inverse=True)
        counts = np.bincount(index, weights=weights)
        self.add_keyed(found.tolist(), [round(c) for c in counts.tolist()])

    def reduce(self) -> None:
        """Halve the resolution until the buckets fit the limit (or the schema is -4)."""
        while len(self.positive) + len(self.negative) > self.limit and self.schema > MIN_SCHEMA:
            self.schema -= 1
            self.positive = _merged(self.positive)
            self.negative = _merged(self.negative)
        self.table = bounds(self.schema) if self.schema > 0 else ()
        self.octave = len(self.table)

    def copy(self) -> Snapshot:
        """What a scrape shows: schema, zero count, positive and negative buckets."""
        return Snapshot(self.schema, self.zero, dict(self.positive), dict(self.negative))


class Snapshot(NamedTuple):
    schema: int
    zero: int
    positive: dict[int, int]
    negative: dict[int, int]


def _merged(buckets: dict[int, int]) -> dict[int, int]:
    """``buckets`` at the next lower schema: bucket ``k`` goes into ``ceil(k/2)``."""
    out: dict[int, int] = {}
    for k, count in buckets.items():
        wider = (k + 1) >> 1
        out[wider] = out.get(wider, 0) + count
    return out


def spans(buckets: dict[int, int]) -> tuple[list[tuple[int, int]], list[int]]:
    """The buckets as Prometheus' protobuf carries them: spans of (offset from the end of the
    previous span, length), and each bucket's count as a delta from the previous one. A gap of
    one or two empty buckets stays inside a span, filled with zeros (client_golang's
    ``makeBuckets``: cheaper than a new span)."""
    out: list[tuple[int, int]] = []
    deltas: list[int] = []
    previous = 0
    following = 0  # the index after the last bucket written
    for n, k in enumerate(sorted(buckets)):
        gap = k - following
        if n == 0 or gap > 2:
            out.append((gap, 0))
        else:
            for _ in range(gap):
                deltas.append(-previous)
                previous = 0
            out[-1] = (out[-1][0], out[-1][1] + gap)
        count = buckets[k]
        deltas.append(count - previous)
        previous = count
        out[-1] = (out[-1][0], out[-1][1] + 1)
        following = k + 1
    return out, deltas
