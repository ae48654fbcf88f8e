"""Pure statistics over a stream's chunk arrival times: ITL per token, stalls, smoothness.

No clock, no telemetry: arrays in, numbers out, so every rule here is tested with literal
timestamps. Work is per window of chunks (vectorised with numpy), never per chunk.

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

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

MIN_GAPS = 3

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TokenWindow:
    """Per-token ITLs of a run of chunks: ``itl[i]`` is observed ``weights[i]`` times.

    The sums are computed once, when the window is made, since every sink needs them.
    """

    itl: FloatArray
    weights: FloatArray
    stalls: int
    median_gap: float | None
    tokens: float = 0.0
    itl_sum: float = 0.0
    itl_sumsq: float = 0.0
    itl_max: float = 0.0
    # per chunk, for traces: arrival times (the previous chunk first), gaps, the stall line
    times_ns: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    gaps: FloatArray = field(default_factory=lambda: np.zeros(0))
    stall_threshold: float | None = None


EMPTY_WINDOW = TokenWindow(np.zeros(0), np.zeros(0), 0, None)


def spread_tokens(total: int, chunks: int) -> npt.NDArray[np.float64]:
    """Distribute ``total`` tokens over ``chunks`` as evenly as integers allow."""
    if chunks <= 0:
        return np.zeros(0)
    base, extra = divmod(max(total, 0), chunks)
    out = np.full(chunks, float(base))
    out[:extra] += 1.0
    return out


def token_window(
    times_ns: npt.NDArray[np.int64],
    tokens: npt.NDArray[np.float64],
    *,
    factor: float,
    min_gap: float,
    baseline_median: float | None = None,
    unit: bool = False,
) -> TokenWindow:
    """ITLs and stalls for chunks ``times_ns[1:]`` (``times_ns[0]`` is the previous chunk).

    ``tokens[i]`` is the number of tokens the chunk at ``times_ns[i + 1]`` carried; a chunk
    with zero tokens contributes its gap to nothing (it should not have been recorded).
    ``baseline_median`` is used when this window has too few gaps for its own median.
    ``unit``: the caller knows every chunk counts as one token (``tokens`` is all ones), the
    usual case, which spares the per-token division.

    A request ends here once, so the numpy calls are few (each costs ~1 us whatever the
    size): one sort gives the median, the largest gap and the stall count together.
    """
    if times_ns.size < 2:
        return TokenWindow(np.zeros(0), np.zeros(0), 0, baseline_median)
    gaps = (times_ns[1:] - times_ns[:-1]) / 1e9
    n = gaps.size
    ordered = np.sort(gaps)
    if unit:
        weights = tokens
        itl = gaps
        count = float(n)
        itl_max = float(ordered[-1])
    else:
        weights = np.maximum(tokens[:n], 1.0)
        itl = gaps / weights
        count = float(weights.sum())
        itl_max = float(itl.max())
    median = float(ordered[n // 2]) if n >= MIN_GAPS else baseline_median  # the upper median
    stalls = 0
    threshold = None
    if median is not None:
        threshold = max(factor * median, min_gap)
        stalls = n - int(np.searchsorted(ordered, threshold, side="left"))  # gaps >= threshold
    return TokenWindow(
        itl,
        weights,
        stalls,
        median,
        tokens=count,
        itl_sum=float(gaps.sum()),  # sum over tokens of gap/k, k times each = the gaps
        itl_sumsq=float(np.dot(itl, gaps)),  # sum of k * (gap/k)^2
        itl_max=itl_max,
        times_ns=times_ns,
        gaps=gaps,
        stall_threshold=threshold,
    )


def upper_median(values: FloatArray) -> float:
    """The element at rank n//2: the median for odd n, the upper middle for even n.

    A partial sort (``np.partition``) is several times cheaper than ``np.median`` on the
    small arrays of a typical request, and either is robust to a minority of stalls.
    """
    k = values.size // 2
    return float(np.partition(values, k)[k])


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
