"""The bench's figures: what a cell's recorded streams say, as plain numbers.

Pure functions over arrays of CLOCK_MONOTONIC nanoseconds; every result is in milliseconds
(latencies) or microseconds (CPU), NaN where there was nothing to measure.

* **delay** of a chunk: its arrival at the client minus the engine's stamp taken just before
  the engine wrote it. Through a target, minus the same figure direct, it is the delay the
  target adds to each chunk, measured on the chunk itself rather than inferred from gaps.
* **TTFT path**: the client's TTFT less the engine's own wait (the rest of its current decode
  step, which the schedule makes uniform in [0, TPOT) and would swamp a sub-millisecond
  difference): the request's way in (engine receipt minus client send) plus the first
  chunk's way out (its delay). Added TTFT is this, through a target, minus direct.
* **jitter**: the standard deviation of the gaps between a stream's chunks at the client.
* **gap added** to a chunk: its delay minus the previous chunk's delay, i.e. how much longer
  the client's gap was than the engine's. A chunk was in flight during a /metrics scrape if
  its [stamp, arrival] interval overlaps the scrape's [start, end].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmobs.bench.stamped_load import Stream

NS_PER_MS = 1e6
Ints = npt.NDArray[np.int64]


def pct(values: npt.ArrayLike, q: float) -> float:
    """The ``q``-th percentile (linear), NaN for no values."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else math.nan


def added(through: float, direct: float) -> float:
    """What a target adds to a figure measured direct (NaN if either is missing)."""
    return through - direct


def ratio(value: float, base: float) -> float:
    """``value / base``; NaN when the base is zero or missing."""
    if not base or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


def _ints(a: Sequence[int]) -> Ints:
    return np.asarray(a, dtype=np.int64)


def chunk_delays(streams: Sequence[Stream]) -> Ints:
    """Arrival minus engine stamp for every recorded chunk, in ns."""
    parts = [_ints(s.arrivals) - _ints(s.sent) for s in streams if len(s.sent)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def ttft_ns(streams: Sequence[Stream]) -> Ints:
    """Client TTFT (send to first token's arrival) of every stream that got a token."""
    return _ints([s.arrivals[0] - s.send_ns for s in streams if len(s.arrivals)])


def ttft_path_ns(streams: Sequence[Stream]) -> Ints:
    """Request path + first chunk path (TTFT less the engine's wait), in ns."""
    return _ints([
        (s.received_ns - s.send_ns) + (s.arrivals[0] - s.sent[0])
        for s in streams if len(s.arrivals) and s.received_ns
    ])  # fmt: skip


def gaps_ns(streams: Sequence[Stream]) -> Ints:
    """Gaps between consecutive chunks of each stream at the client, in ns."""
    parts = [np.diff(_ints(s.arrivals)) for s in streams if len(s.arrivals) > 1]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def gap_added_ns(stream: Stream) -> Ints:
    """Per chunk after the first: client gap minus engine gap (= change in delay), in ns."""
    return np.diff(_ints(stream.arrivals) - _ints(stream.sent))


@dataclass(frozen=True)
class Latency:
    """A cell's latency figures, in ms."""

    requests: int
    ok: int
    chunks: int
    ttft_p50: float
    ttft_p99: float
    ttft_path_p50: float
    ttft_path_p99: float
    delay_p50: float
    delay_p99: float
    delay_max: float
    gap_p50: float
    jitter: float  # stdev of client gaps
    gap_added_jitter: float  # stdev of client gap minus engine gap


def latency(streams: Sequence[Stream]) -> Latency:
    """Summarise one cell's streams."""
    delays = chunk_delays(streams) / NS_PER_MS
    ttft = ttft_ns(streams) / NS_PER_MS
    path = ttft_path_ns(streams) / NS_PER_MS
    gaps = gaps_ns(streams) / NS_PER_MS
    parts = [gap_added_ns(s) for s in streams if len(s.arrivals) > 1]
    gap_added = np.concatenate(parts) / NS_PER_MS if parts else np.zeros(0)
    return Latency(
        requests=len(streams),
        ok=sum(s.ok for s in streams),
        chunks=sum(s.chunks for s in streams),
        ttft_p50=pct(ttft, 50), ttft_p99=pct(ttft, 99),
        ttft_path_p50=pct(path, 50), ttft_path_p99=pct(path, 99),
        delay_p50=pct(delays, 50), delay_p99=pct(delays, 99),
        delay_max=float(delays.max()) if delays.size else math.nan,
        gap_p50=pct(gaps, 50),
        jitter=float(gaps.std()) if gaps.size else math.nan,
        gap_added_jitter=float(gap_added.std()) if gap_added.size else math.nan,
    )  # fmt: skip


@dataclass(frozen=True)
class ScrapeEffect:
    """Gap added to chunks in flight during a scrape, against the chunks that were not (ms)."""

    scrapes: int
    chunks_during: int
    during_p99: float
    during_max: float
    outside_p99: float
    outside_max: float


def in_windows(
    starts_ns: Ints, ends_ns: Ints, windows: Sequence[tuple[int, int]]
) -> npt.NDArray[np.bool_]:
    """Whether each interval [start, end] overlaps one of ``windows`` (sorted, disjoint)."""
    if not windows:
        return np.zeros(starts_ns.shape, dtype=bool)
    w = np.asarray(sorted(windows), dtype=np.int64)
    last = np.searchsorted(w[:, 0], ends_ns, side="right") - 1  # last scrape begun by the end
    hit: npt.NDArray[np.bool_] = (last >= 0) & (w[np.maximum(last, 0), 1] >= starts_ns)
    return hit


def scrape_effect(streams: Sequence[Stream], windows: Sequence[tuple[int, int]]) -> ScrapeEffect:
    """Split every chunk's gap added by whether a scrape overlapped its way to the client."""
    during: list[Ints] = []
    outside: list[Ints] = []
    for s in streams:
        if len(s.arrivals) < 2:
            continue
        added_ns = gap_added_ns(s)
        mask = in_windows(_ints(s.sent)[1:], _ints(s.arrivals)[1:], windows)
        during.append(added_ns[mask])
        outside.append(added_ns[~mask])
    d = np.concatenate(during) / NS_PER_MS if during else np.zeros(0)
    o = np.concatenate(outside) / NS_PER_MS if outside else np.zeros(0)
    return ScrapeEffect(
        scrapes=len(windows), chunks_during=int(d.size),
        during_p99=pct(d, 99), during_max=float(d.max()) if d.size else math.nan,
        outside_p99=pct(o, 99), outside_max=float(o.max()) if o.size else math.nan,
    )  # fmt: skip


def cpu_split(runs: Sequence[tuple[float, int, int]]) -> tuple[float, float]:
    """Fit ``cpu = a * chunks + b * requests`` over runs of (CPU seconds, chunks, requests).

    Two runs of different tokens per request separate the per-chunk cost ``a`` from the
    per-request cost ``b`` (both returned in µs); fewer, or collinear runs, give NaN.
    """
    if len(runs) < 2:
        return math.nan, math.nan
    x = np.asarray([[c, r] for _, c, r in runs], dtype=np.float64)
    y = np.asarray([cpu for cpu, _, _ in runs], dtype=np.float64)
    if np.linalg.matrix_rank(x) < 2:
        return math.nan, math.nan
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a) * 1e6, float(b) * 1e6


def per_unit_us(cpu_s: float, count: int) -> float:
    """CPU microseconds per chunk (or request); NaN for none."""
    return cpu_s / count * 1e6 if count else math.nan


def per_stream_kib(rss_with: int, rss_without: int, streams: int) -> float:
    """Resident memory per open stream, KiB: the difference with and without, over N."""
    return (rss_with - rss_without) / streams / 1024 if streams else math.nan


def median(values: Sequence[float]) -> float:
    """Median over rounds, ignoring NaN (NaN if nothing)."""
    clean = [v for v in values if not math.isnan(v)]
    return float(np.median(clean)) if clean else math.nan
