"""A window of a stream's per-token ITLs, and how it fills a histogram's buckets.

A window is made one of two ways (``stats``): a short one in plain lists (``ListWindow``,
most requests), a long one in numpy arrays (``ArrayWindow``). Both have the same fields and
the same methods, so a consumer bins any window with ``classic_counts`` and ``fill_native``
and never asks which kind it holds: the small-stream path stays inside this module. A window
says how many of its ITLs fall in each bucket; where a histogram keeps its counts is the
histogram's own business (``export.metrics.series``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Floats = FloatArray | list[float]
Ints = IntArray | list[int]
# a histogram's buckets a window's ITLs fall in: (bucket index, how many), each bucket once
# at most, whole numbers as floats (as numpy's ``bincount`` gives them)
Binned = list[tuple[int, float]]


class NativeTarget(Protocol):
    """Where a window's ITLs go for a native histogram (``export.metrics.native``)."""

    def add(self, value: float, count: int = 1) -> None: ...

    def add_sorted(self, values: list[float]) -> None: ...

    def add_array(self, values: FloatArray, weights: FloatArray | None = None) -> None: ...


class TokenWindow(NamedTuple):
    """Per-token ITLs of a run of chunks: ``values[i]`` is observed ``counts[i]`` times.

    The sums are computed once, when the window is made, since every consumer needs them.
    ``itl``, ``weights``, ``gaps`` and ``times_ns`` are numpy arrays whichever kind the window
    is (converted on access from lists: only the tracing consumer asks, once or twice).
    A named tuple (docs/architecture.md, "Records are named tuples"); make one through
    ``ListWindow`` or ``ArrayWindow``, which bin it.
    """

    values: Floats  # per-token ITL of each chunk
    counts: Floats | None  # tokens each ITL is observed for; None: one each
    stalls: int
    median_gap: float | None
    tokens: float = 0.0
    itl_sum: float = 0.0
    itl_sumsq: float = 0.0
    itl_max: float = 0.0
    # per chunk, for traces: arrival times (the previous chunk first), gaps, the stall line
    chunk_times: Ints | None = None
    chunk_gaps: Floats | None = None
    stall_threshold: float | None = None
    # ``values`` in ascending order when each is observed once: binned a bucket at a time
    ordered: Floats | None = None

    @property
    def size(self) -> int:
        """How many ITL values (chunks after the first) the window holds."""
        return len(self.values)

    @property
    def itl(self) -> FloatArray:
        return _floats(self.values)

    @property
    def weights(self) -> FloatArray:
        if self.counts is None:
            return np.ones(len(self.values))
        return _floats(self.counts)

    @property
    def gaps(self) -> FloatArray:
        return _floats(self.chunk_gaps if self.chunk_gaps is not None else [])

    @property
    def times_ns(self) -> IntArray:
        times = self.chunk_times if self.chunk_times is not None else []
        return times if isinstance(times, np.ndarray) else np.array(times, dtype=np.int64)

    def classic_counts(self, bounds: Sequence[float], bounds_array: FloatArray) -> Binned:
        """How many ITLs (each ``counts[i]`` times) fall in each bucket of ``bounds`` (upper
        bounds, the last +Inf's left implicit: bucket ``len(bounds)``), the buckets with any.
        ``bounds_array`` is ``bounds`` as numpy's, made once by the caller."""
        raise NotImplementedError

    def fill_native(self, buckets: NativeTarget) -> None:
        """Add each ITL (``counts[i]`` times) to a native histogram's buckets."""
        raise NotImplementedError


class ListWindow(TokenWindow):
    """A short window in plain lists: binned value by value, or a bucket at a time when the
    ITLs are sorted (one token per chunk: a few bisections for a steady stream)."""

    __slots__ = ()

    def classic_counts(self, bounds: Sequence[float], bounds_array: FloatArray) -> Binned:
        ordered = self.ordered
        if ordered is not None:  # a run of values in one bucket at a time
            runs: Binned = []
            top, n, i = len(bounds), len(ordered), 0
            while i < n:
                b = bisect_left(bounds, ordered[i])
                j = bisect_right(ordered, bounds[b], i) if b < top else n
                runs.append((b, float(j - i)))
                i = j
            return runs
        binned: dict[int, float] = {}
        counts = self.counts
        if counts is None:
            for value in self.values:
                b = bisect_left(bounds, value)
                binned[b] = binned.get(b, 0.0) + 1.0
        else:
            for value, count in zip(self.values, counts, strict=True):
                b = bisect_left(bounds, value)
                binned[b] = binned.get(b, 0.0) + count
        return list(binned.items())

    def fill_native(self, buckets: NativeTarget) -> None:
        ordered = self.ordered
        if ordered is not None:
            buckets.add_sorted(ordered)  # type: ignore[arg-type]
            return
        counts = self.counts
        if counts is None:
            for value in self.values:
                buckets.add(value)
        else:
            for value, count in zip(self.values, counts, strict=True):
                buckets.add(value, round(count))


class ArrayWindow(TokenWindow):
    """A long window in numpy arrays: binned in a few numpy calls."""

    __slots__ = ()

    def classic_counts(self, bounds: Sequence[float], bounds_array: FloatArray) -> Binned:
        ordered = self.ordered
        if ordered is not None:
            if not len(ordered):  # (an empty window bins into nothing, as a list window does)
                return []
            return _bin_sorted_array(bounds, bounds_array, ordered)  # type: ignore[arg-type]
        index = np.searchsorted(bounds_array, self.values, side="left")
        binned = np.bincount(index, weights=self.weights, minlength=bounds_array.size + 1)
        return [(i, count) for i, count in enumerate(binned.tolist()) if count]

    def fill_native(self, buckets: NativeTarget) -> None:
        ordered = self.ordered
        if ordered is not None:
            buckets.add_array(ordered)  # type: ignore[arg-type]
        else:
            buckets.add_array(
                self.values,  # type: ignore[arg-type]
                self.weights if self.counts is not None else None,
            )


def _bin_sorted_array(
    bounds: Sequence[float], bounds_array: FloatArray, ordered: FloatArray
) -> Binned:
    """Ascending ITLs of one token each (numpy): the values at or below each bound between
    the first value's bucket and the last's."""
    lo = bisect_left(bounds, float(ordered[0]))
    hi = bisect_left(bounds, float(ordered[-1]))
    runs: Binned = []
    done = 0
    if hi > lo:
        below = np.searchsorted(ordered, bounds_array[lo:hi], side="right").tolist()
        for b, count in enumerate(below, lo):
            if count != done:
                runs.append((b, float(count - done)))
                done = count
    if len(ordered) != done:
        runs.append((hi, float(len(ordered) - done)))
    return runs


def _floats(values: Floats) -> FloatArray:
    return values if isinstance(values, np.ndarray) else np.array(values, dtype=np.float64)


EMPTY_WINDOW = ArrayWindow(np.zeros(0), None, 0, None)
