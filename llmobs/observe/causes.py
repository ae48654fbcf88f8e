"""Why a stream stalled: each stall's cause, from what every stream on the engine did.

A stall (``stats``: a gap between chunks far above the stream's own rhythm) is judged once,
when its window is taken (at the request's end, or mid-stream for a long one), against the
engine's ``EngineTimeline``: the streams in flight and those that ended lately (their first
token and their chunk times, which their clocks hold anyway: nothing is added per chunk), the
times the relay stopped reading because this request's client took nothing, and the samples
of the engine's preemption counter (the engine collector's). The rules, first match wins:

- ``client``: the relay had stopped reading the engine for this request, its client's buffer
  full, for at least half the gap: the engine's tokens waited behind the client;
- ``preemption``: the engine's preemption counter rose between two scrapes whose interval
  overlaps the gap, and either other streams went on meanwhile (a preempted request stops
  alone; when every stream stopped, the engine did) or this stream resumed with a prefill's
  first tokens, within half its rhythm of one (it was recomputed in that prefill). The
  counter is engine-wide and only as exact as the scrape interval: a stall of this kind
  near a preemption of another request is counted one too;
- ``prefill``: another request's prefill ended inside the gap and can have taken half of
  it: its first token came in the gap (up to an eighth of it after its end: the same engine
  step), at least half a gap after it reached the engine or the gap began; or another stream
  resumed in the gap after a silence that began before this gap did and in which a
  preemption was counted (a preempted request's recompute: a prefill that shows no first
  token), as long after either;
- ``engine_pause``: no other stream flowed inside the gap (got a chunk there after one
  before it, an eighth of the gap at either end aside: the steps around it), and no prefill
  explains it: the whole engine stopped.
  A stream alone on the engine pauses with the engine;
- ``unknown``: other streams flowed while this one waited, for no reason seen here.

The engine's streams are compared only as far back as they are kept (``keep_s``, ``keep``
ended requests), which bounds the work of a stall: a stall is rare, its classification
scans the streams that overlap it, and nothing here runs per chunk. Pure: times are
arguments (nanoseconds on the relay's monotonic clock).
"""

from __future__ import annotations

import collections
import enum
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from llmobs.observe.window import IntArray, TokenWindow

EDGE = 8  # an eighth of a gap at either end belongs to the steps around it (delivery jitter)


class StallCause(enum.StrEnum):
    """Why a stall happened (a label value: a closed set)."""

    PREFILL = "prefill"
    PREEMPTION = "preemption"
    ENGINE_PAUSE = "engine_pause"
    CLIENT = "client"
    UNKNOWN = "unknown"


STALL_CAUSES: tuple[StallCause, ...] = tuple(StallCause)


class Stall(NamedTuple):
    """One stall: the chunks either side of the gap (ns) and its cause."""

    start_ns: int
    end_ns: int
    cause: StallCause

    @property
    def gap_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


Holds = Sequence[tuple[int, int]]  # (start, end) ns; an open hold ends at the largest int
Times = Sequence[int] | IntArray  # chunk times, ns, ascending: a clock's tape, a window's


class Trail(NamedTuple):
    """What one stream did, as other streams' stalls read it: when it reached the engine,
    its first token (None: none yet), its chunk times (ascending; the oldest may be cut
    away), and when the relay held its reading for its client."""

    forwarded_ns: int | None
    first_ns: int | None
    times: Times
    holds: Holds = ()


class Traced(Protocol):
    """A stream in flight: its trail now (``clock.RequestClock``)."""

    def trail(self) -> Trail: ...


class EngineTimeline:
    """The streams of one engine, in flight and lately ended, and its preemption counter."""

    __slots__ = ("_budget", "_ended", "_keep", "_keep_ns", "_kept", "_live", "_samples")

    def __init__(
        self, keep_s: float = 120.0, keep: int = 2048, times: int = 1 << 20, samples: int = 512
    ) -> None:
        """Ended streams are kept ``keep_s`` seconds, ``keep`` of them, ``times`` chunk times
        in all (8 bytes each): the oldest go first."""
        self._keep_ns = int(keep_s * 1e9)
        self._keep = keep
        self._budget = times
        self._kept = 0  # chunk times held by the ended streams kept
        self._live: dict[int, Traced] = {}
        self._ended: collections.deque[tuple[int, int, Trail]] = collections.deque()
        # (scrape sent, answer read, counter value) of the engine's preemption counter
        self._samples: collections.deque[tuple[int, int, float]] = collections.deque(maxlen=samples)

    def started(self, key: int, stream: Traced) -> None:
        """A request went upstream (once per request)."""
        self._live[key] = stream

    def ended(self, key: int, end_ns: int, trail: Trail | None) -> None:
        """A request ended; its trail (None: it streamed nothing) is kept a while: its
        times must be the trail's own (not an array the request still writes)."""
        self._live.pop(key, None)
        ended = self._ended
        if trail is not None and len(trail.times):
            ended.append((end_ns, key, trail))
            self._kept += len(trail.times)
        horizon = end_ns - self._keep_ns
        while ended and (
            ended[0][0] < horizon or len(ended) > self._keep or self._kept > self._budget
        ):
            self._kept -= len(ended.popleft()[2].times)

    def preemptions(self, sent_ns: int, read_ns: int, total: float) -> None:
        """A scrape of the engine's preemption counter: asked at ``sent_ns``, read at
        ``read_ns``. A counter that went down (an engine restart) starts afresh."""
        self._samples.append((sent_ns, read_ns, total))

    def _preempted(self, start: int, end: int) -> bool:
        """Whether the counter rose between two scrapes whose interval overlaps the gap."""
        before: tuple[int, int, float] | None = None
        for sample in self._samples:
            if (
                before is not None
                and sample[2] > before[2]
                and before[0] < end
                and sample[1] > start
            ):
                return True
            before = sample
        return False

    def _others(self, key: int, start: int) -> Iterator[Trail]:
        """The other streams that may have had a chunk after ``start``: those in flight,
        and those that ended after it (newest first)."""
        for other, stream in list(self._live.items()):
            if other != key:
                yield stream.trail()
        for end_ns, other, trail in reversed(self._ended):
            if end_ns < start:
                return
            if other != key:
                yield trail

    def classify(
        self, key: int, gaps: Iterable[tuple[int, int]], median: float | None, holds: Holds = ()
    ) -> list[StallCause]:
        """The cause of each stall of request ``key`` (gaps as (start, end) ns), in order;
        ``median``: the stream's median gap in seconds, its rhythm; ``holds``: when its
        reading was held for its client."""
        step = round((median or 0.0) * 1e9)
        return [self._cause(key, start, end, step, holds) for start, end in gaps]

    def _cause(self, key: int, start: int, end: int, step: int, holds: Holds) -> StallCause:
        gap = end - start
        if _held(holds, start, end) * 2 >= gap:
            return StallCause.CLIENT
        preempted = self._preempted(start, end)
        edge = gap // EDGE
        silence = start - max(edge, step // 2)  # another stream's silence began before this
        flowed = prefilled = recomputed = False
        for trail in self._others(key, start):
            prefilled = prefilled or self._prefilled(trail, start, end, edge, silence)
            flowed = flowed or _flowed(trail.times, start + edge, end - edge, silence)
            first = trail.first_ns
            # this stream resumed with a prefill's first tokens: it was in that prefill
            recomputed = recomputed or (first is not None and abs(first - end) < step // 2)
            if preempted and (flowed or (prefilled and recomputed)):
                return StallCause.PREEMPTION  # it stopped alone, or was recomputed
            if prefilled and not preempted:
                return StallCause.PREFILL
        if prefilled:
            return StallCause.PREFILL
        return StallCause.UNKNOWN if flowed else StallCause.ENGINE_PAUSE

    def _prefilled(self, trail: Trail, start: int, end: int, edge: int, silence: int) -> bool:
        """Whether this stream's prefill ended inside the gap and can have taken half of
        it: its first token, or a chunk after a silence that began before ``silence`` in
        which a preemption was counted (its recompute; not while its own client held it).
        The prefill began at the earliest when the stream reached the engine or went silent."""
        first, late, half = trail.first_ns, end + edge, (end - start + 1) // 2
        if first is not None and start + edge < first <= late:
            forwarded = trail.forwarded_ns
            began = start if forwarded is None or forwarded < start else forwarded
            return min(first, end) - began >= half
        times = trail.times
        i = _index_after(times, start + edge)
        if i == 0 or i >= len(times) or times[i] > late:
            return False
        before, after = int(times[i - 1]), int(times[i])
        if before >= silence or _held(trail.holds, before, after):
            return False
        return min(after, end) - max(before, start) >= half and self._preempted(before, after)


def _held(holds: Holds, start: int, end: int) -> int:
    """Nanoseconds of (start, end) in which reading was held for the client."""
    total = 0
    for hold_start, hold_end in holds:
        total += max(0, min(end, hold_end) - max(start, hold_start))
    return total


def _index_after(times: Times, t: int) -> int:
    """The index of the first time after ``t``."""
    if isinstance(times, np.ndarray):
        return int(np.searchsorted(times, t, side="right"))
    return bisect_right(times, t)


def _flowed(times: Times, start: int, end: int, silence: int) -> bool:
    """Whether the stream flowed strictly inside (start, end): a chunk there that follows
    one after ``silence`` (a first token, or a chunk after a long silence, is a prefill's
    end, not flow)."""
    i = _index_after(times, start)
    while i < len(times) and times[i] < end:
        if i > 0 and times[i - 1] >= silence:
            return True
        i += 1
    return False


def stall_gaps(window: TokenWindow) -> list[tuple[int, int]]:
    """The (start, end) ns of each stall in a window (the chunks either side of the gap)."""
    threshold = window.stall_threshold
    if not window.stalls or threshold is None:
        return []
    times, gaps = window.chunk_times, window.chunk_gaps
    if times is None or gaps is None:
        return []
    return [(int(times[i]), int(times[i + 1])) for i, gap in enumerate(gaps) if gap >= threshold]


def count_causes(total: int, stalls: Iterable[Stall]) -> list[tuple[StallCause, int]]:
    """The request's ``total`` stalls by cause (those with any), from the ones judged;
    those past them (a pathological stream's) count as unknown."""
    counts = dict.fromkeys(STALL_CAUSES, 0)
    for stall in stalls:
        counts[stall.cause] += 1
        total -= 1
    if total > 0:
        counts[StallCause.UNKNOWN] += total
    return [(cause, n) for cause, n in counts.items() if n]
