"""Pure statistics over a stream's chunk arrival times: ITL per token, stalls, smoothness.

No clock, no telemetry: arrays in, numbers out, so every rule here is tested with literal
timestamps. Work is per window of chunks, never per chunk: vectorised with numpy, or for a
small window (most requests) in plain Python with the same results.

Rules, and why:
- **ITL per token** (SGLang's rule): the gap between two consecutive output chunks is divided
  evenly among the tokens the later chunk carries and counted once per token, so speculative
  decoding and ``--stream-interval`` batching do not hide as one long gap.
- **Stall**: a gap between chunks of at least ``factor`` x the median gap of the request (the
  median resists the stalls themselves, unlike the mean) and at least ``min_gap`` seconds
  (pauses too short for a person to see are not stalls). Gaps between chunks, not per-token
  ITLs: a stall is a pause in what the user sees. With fewer than ``MIN_GAPS`` gaps a request
  has no rhythm to break and no stall is counted. Defaults 3x and 50 ms: a 100 ms pause in a
  20 ms/token stream is 5x the median (a stall); +-20 % jitter is at most 1.25x (not one).
- **Smoothness** = 1 / (1 + CV^2) of the per-token ITLs, which equals mean^2 / E[x^2] =
  (sum x)^2 / (n * sum x^2). It is 1 for a perfectly steady stream, independent of speed
  (CV is scale-free), and falls with stutter: 20 ms tokens with a 100 ms pause every 50
  tokens score ~0.71, +-10 % jitter ~0.997. Because it is built from n, sum and sum of squares,
  the same number is computable across pods from the exported counters. Etalon's
  fluidity-index (arXiv 2407.07000) needs per-deployment deadline SLOs, so it measures meeting
  a target rather than steadiness; we keep the SLO side in the alert rules instead.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import repeat
from operator import sub, truediv

import numpy as np
import numpy.typing as npt

from llmobs.observe.window import ArrayWindow, FloatArray, IntArray, ListWindow, TokenWindow

MIN_GAPS = 3
# Windows with fewer gaps than this (most requests: one window of a few dozen chunks) are
# computed in plain Python by ``small_window``: for short windows numpy's fixed cost per call,
# a dozen calls per window, is most of the work. Where the two cost the same was measured
# where it runs (``benchmarks/inproc.py time --probe``, docs/benchmarks.md).
SMALL = 96  # at most 128: pairwise_sums follows numpy that far


def spread_tokens(total: int, chunks: int) -> npt.NDArray[np.float64]:
    """Distribute ``total`` tokens over ``chunks`` as evenly as integers allow."""
    if chunks <= 0:
        return np.zeros(0)
    base, extra = divmod(max(total, 0), chunks)
    out = np.full(chunks, float(base))
    out[:extra] += 1.0
    return out


def spread_list(total: int, chunks: int) -> list[float]:
    """``spread_tokens`` as a list, for ``small_window``."""
    if chunks <= 0:
        return []
    base, extra = divmod(max(total, 0), chunks)
    return [float(base + 1)] * extra + [float(base)] * (chunks - extra)


def token_window(
    times_ns: IntArray,
    tokens: FloatArray | None,
    *,
    factor: float,
    min_gap: float,
    baseline_median: float | None = None,
) -> TokenWindow:
    """ITLs and stalls for chunks ``times_ns[1:]`` (``times_ns[0]`` is the previous chunk).

    ``tokens[i]`` is the number of tokens the chunk at ``times_ns[i + 1]`` carried; a chunk
    with zero tokens contributes its gap to nothing (it should not have been recorded).
    ``tokens`` None: every chunk counts as one token, the usual case, which spares the
    per-token division. ``baseline_median`` is used when this window has too few gaps for its
    own median.

    A request ends here once, so the numpy calls are few (each has a fixed cost whatever the
    size): one sort gives the median, the largest gap and the stall count together.
    """
    if times_ns.size < 2:
        return ArrayWindow(np.zeros(0), None if tokens is None else np.zeros(0), 0, baseline_median)
    gaps = (times_ns[1:] - times_ns[:-1]) / 1e9
    n = gaps.size
    ordered = np.sort(gaps)
    if tokens is None:
        weights = None
        itl = gaps
        count = float(n)
        itl_max = float(ordered[-1])
    else:
        weights = np.maximum(tokens[:n], 1.0)
        itl = gaps / weights
        count = float(np.add.reduce(weights))
        itl_max = float(itl.max())
    median = float(ordered[n // 2]) if n >= MIN_GAPS else baseline_median  # the upper median
    stalls = 0
    threshold = None
    if median is not None:
        threshold = max(factor * median, min_gap)
        if threshold <= ordered[-1]:  # else none (the usual case, without a numpy call)
            stalls = n - int(np.searchsorted(ordered, threshold, side="left"))  # gaps >= it
    return ArrayWindow(
        itl,
        weights,
        stalls,
        median,
        count,
        float(np.add.reduce(gaps)),  # sum over tokens of gap/k, k times each = the gaps
        # sum of k * (gap/k)^2: a pairwise sum of the products (not ``np.dot``, whose order
        # of additions is the BLAS's and the CPU's), which ``small_window`` repeats exactly
        float(np.add.reduce(itl * gaps)),
        itl_max,
        times_ns,
        gaps,
        threshold,
        ordered if weights is None else None,
    )


def small_window(
    times_ns: list[int],
    tokens: list[float] | None,
    *,
    factor: float,
    min_gap: float,
    baseline_median: float | None = None,
) -> TokenWindow:
    """``token_window`` in plain Python, for fewer than ``SMALL`` gaps: the same numbers to
    the last bit (``tests/unit/observe/test_stats.py`` checks it on random windows), with no
    numpy call where ``token_window`` makes a dozen.

    The sorting, median, stall count, maximum, per-token division and products are exact in
    either language, and both sums are numpy's pairwise summation, repeated in
    ``pairwise_sums`` (for the few gaps of a short request, cheaper than making one array).
    """
    n = len(times_ns) - 1
    if n < 1:
        return ListWindow([], None if tokens is None else [], 0, baseline_median)
    # (b - a) / 1e9 for each pair, in C's loops: a comprehension's frame costs a quarter more
    gaps = list(map(truediv, map(sub, times_ns[1:], times_ns), repeat(1e9, n)))
    ordered = sorted(gaps)
    if tokens is None:
        weights = None
        itl = gaps
        count = float(n)
        itl_max = ordered[-1]
        total, sumsq = pairwise_sums(gaps)
    else:
        weights = [t if t > 1.0 else 1.0 for t in tokens[:n]]
        itl = [g / w for g, w in zip(gaps, weights, strict=True)]
        count = float(sum(weights))  # whole numbers: exact in any order
        itl_max = max(itl)
        total, sumsq = pairwise_sums(gaps, itl)  # sum of k * (gap/k)^2 = of gap * itl
    median = ordered[n // 2] if n >= MIN_GAPS else baseline_median
    stalls = 0
    threshold = None
    if median is not None:
        threshold = max(factor * median, min_gap)
        stalls = n - bisect_left(ordered, threshold)
    return ListWindow(
        itl,
        weights,
        stalls,
        median,
        count,
        total,
        sumsq,
        itl_max,
        times_ns,
        gaps,
        threshold,
        ordered if weights is None else None,
    )


def pairwise_sums(values: list[float], by: list[float] | None = None) -> tuple[float, float]:
    """``np.add.reduce`` of ``values`` and of ``values * by`` (``by`` None: the squares), to
    the last bit, for fewer than 128 values, in one pass: numpy's pairwise summation, which
    below 8 values adds in order (from -0.0) and up to 128 keeps eight interleaved partial
    sums, added in a fixed tree, then the rest in order; the reduction then adds that to its
    identity, 0.0. Both sums in one loop and no list of products (docs/benchmarks.md)."""
    other = values if by is None else by
    n = len(values)
    if n < 8:
        total = product = -0.0
        for value, factor in zip(values, other, strict=True):
            total += value
            product += value * factor
        return 0.0 + total, 0.0 + product
    r0, r1, r2, r3, r4, r5, r6, r7 = values[:8]
    f0, f1, f2, f3, f4, f5, f6, f7 = other[:8]
    q0, q1, q2, q3 = r0 * f0, r1 * f1, r2 * f2, r3 * f3
    q4, q5, q6, q7 = r4 * f4, r5 * f5, r6 * f6, r7 * f7
    end = n - n % 8
    for i in range(8, end, 8):
        v0, v1, v2, v3, v4, v5, v6, v7 = values[i : i + 8]
        f0, f1, f2, f3, f4, f5, f6, f7 = other[i : i + 8]
        r0 += v0
        r1 += v1
        r2 += v2
        r3 += v3
        r4 += v4
        r5 += v5
        r6 += v6
        r7 += v7
        q0 += v0 * f0
        q1 += v1 * f1
        q2 += v2 * f2
        q3 += v3 * f3
        q4 += v4 * f4
        q5 += v5 * f5
        q6 += v6 * f6
        q7 += v7 * f7
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    product = ((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7))
    for i in range(end, n):
        value = values[i]
        total += value
        product += value * other[i]
    return 0.0 + total, 0.0 + product


def smoothness(count: float, total: float, sumsq: float) -> float | None:
    """1 / (1 + CV^2) from the count, sum and sum of squares of per-token ITLs."""
    if count < 2 or sumsq <= 0.0:
        return None
    return min(1.0, (total * total) / (count * sumsq))


def tpot(first_ns: int | None, last_ns: int | None, output_tokens: int) -> float | None:
    """Time per output token after the first: (last - first) / (tokens - 1)."""
    if first_ns is None or last_ns is None or output_tokens < 2:
        return None
    return (last_ns - first_ns) / 1e9 / (output_tokens - 1)
