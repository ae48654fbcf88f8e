"""Timing: output-chunk timestamps of one request -> windows of ITLs and a final StreamStats.

Time is an argument: the proxy reads the clock once per chunk (``time.perf_counter_ns``) and
passes it in; nothing here reads a clock, so tests drive it with literal timestamps.

Per chunk the timer only appends two numbers to compact arrays (16 bytes). Statistics run once
at the end of the request in ``stats``; only a stream longer than ``window`` chunks (65536 by
default, 1 MiB of arrays) is cut into windows that the caller takes (``take_window``) and
hands to the sinks as they fill, which keeps memory bounded. The window is large because the
engine's final ``usage`` can only be spread over chunks not yet taken.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmobs import stats
from llmobs.stats import TokenWindow


class Outcome(enum.StrEnum):
    """How a request ended; exactly one per request."""

    OK = "ok"
    CLIENT_DISCONNECT = "client_disconnect"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    REJECTED = "rejected"
    SHUTDOWN = "shutdown"  # the sidecar stopped before the stream ended (grace period over)


class TokenSource(enum.StrEnum):
    """Where the output token count came from."""

    USAGE = "usage"  # the engine's own usage numbers
    COUNTED = "counted"  # one token per output chunk


@dataclass(frozen=True, slots=True)
class StreamStats:
    """The finished record of one request, handed to every sink."""

    operation: str
    model: str | None
    outcome: Outcome
    status: int
    stream: bool
    duration_s: float
    ttft_s: float | None
    tpot_s: float | None
    input_tokens: int | None
    output_tokens: int
    token_source: TokenSource
    chunks: int
    itl_count: float
    itl_sum: float
    itl_sumsq: float
    itl_max: float
    stalls: int
    smoothness: float | None
    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: tuple[str, ...] = ()
    finish_reason: str = "none"  # the bounded label: first choice's normalized reason
    reasoning_tokens: int | None = None
    reasoning_source: TokenSource = TokenSource.USAGE
    cached_tokens: int | None = None
    engine_prompt_eval_s: float | None = None  # durations only the engine knows (Ollama)
    engine_load_s: float | None = None
    dialect: str = "openai"


class StreamTimer:
    """Collects output-chunk times of one request; windows of ITLs; the final stats."""

    __slots__ = (
        "_counts",
        "_itl_count",
        "_itl_max",
        "_itl_sum",
        "_itl_sumsq",
        "_median",
        "_stalls",
        "_taken",
        "_times",
        "_uneven",
        "chunks",
        "factor",
        "first_ns",
        "flushed_tokens",
        "last_ns",
        "min_gap",
        "start_ns",
        "tokens",
        "window",
    )

    def __init__(
        self, start_ns: int, *, factor: float = 3.0, min_gap: float = 0.05, window: int = 65536
    ) -> None:
        self.start_ns = start_ns
        self.factor = factor
        self.min_gap = min_gap
        self.window = window
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.tokens = 0  # output tokens counted so far (chunk counts or per-chunk usage)
        self.chunks = 0
        self.flushed_tokens = 0  # tokens of chunks already taken in windows
        self._times = array("q")  # anchor (previous window's last chunk) + this window's chunks
        self._counts = array("q")
        self._median: float | None = None
        self._stalls = 0
        self._taken = False  # a window was taken: the first chunk is accounted
        self._uneven = False  # a chunk after the window's first carried other than one token
        self._itl_count = 0.0
        self._itl_sum = 0.0
        self._itl_sumsq = 0.0
        self._itl_max = 0.0

    def output(self, t_ns: int, tokens: int) -> bool:
        """Record a chunk of ``tokens`` output tokens at ``t_ns``; True when the window is full
        (``take_window`` is due). Once per output chunk: kept to appends and counters."""
        self.tokens += tokens
        self.chunks += 1
        self.last_ns = t_ns
        times = self._times
        times.append(t_ns)
        self._counts.append(tokens)
        if self.first_ns is None:
            self.first_ns = t_ns
        elif tokens != 1:
            self._uneven = True
        return len(times) > self.window

    @property
    def window_full(self) -> bool:
        return len(self._times) > self.window

    def take_window(self, total_tokens: int | None = None) -> TokenWindow:
        """ITLs of the chunks recorded since the last window; keeps the last as the anchor.

        ``total_tokens`` (final call only): the engine's own output count when chunk counts
        were only assumed (one per chunk); it is spread evenly over the chunks not yet taken.
        """
        times = self._times
        chunks = len(times) - 1  # the first is the anchor (or the first chunk, not timed)
        if chunks < 1:
            return stats.EMPTY_WINDOW
        counts = self._counts
        first_window = not self._taken
        self._taken = True
        head = counts[0] if first_window else 0  # the first chunk keeps its count
        if total_tokens is None:
            spread = self.tokens - self.flushed_tokens - head  # what counts[1:] add up to
            unit = not self._uneven
            if unit:
                pending = np.ones(chunks)
            else:
                pending = np.frombuffer(counts, dtype=np.int64)[1:].astype(np.float64)
        else:
            rest = max(total_tokens - (head if first_window else self.flushed_tokens), 0)
            base, extra = divmod(rest, chunks)
            spread = rest
            unit = base == 0 or (base == 1 and extra == 0)  # weights max(count, 1) all ones
            pending = np.ones(chunks) if unit else stats.spread_tokens(rest, chunks)
        window = stats.token_window(
            np.frombuffer(times, dtype=np.int64),
            pending,
            factor=self.factor,
            min_gap=self.min_gap,
            baseline_median=self._median,
            unit=unit,
        )
        self._median = window.median_gap
        self._stalls += window.stalls
        self._itl_count += window.tokens
        self._itl_sum += window.itl_sum
        self._itl_sumsq += window.itl_sumsq
        self._itl_max = max(self._itl_max, window.itl_max)
        self.flushed_tokens += spread + head
        self._times = array("q", [times[-1]])
        self._counts = array("q", [counts[-1]])
        self._uneven = False
        return window

    def finish(self, end_ns: int, **meta: Any) -> StreamStats:
        """The record of a one-choice request: ``finish_request([self], ...)``."""
        return finish_request([self], end_ns, **meta)


def finish_request(
    timers: Sequence[StreamTimer],
    end_ns: int,
    *,
    operation: str,
    model: str | None,
    outcome: Outcome,
    status: int,
    stream: bool,
    input_tokens: int | None,
    output_tokens: int | None,
    **extra: Any,
) -> StreamStats:
    """The request's record from its choices' timers (one, or one per choice for n > 1).

    Call after each timer's final ``take_window``. TTFT is the first token of any choice;
    ITL sums, stalls and smoothness pool every choice's tokens; TPOT is the pooled decode
    time over the pooled tokens after each choice's first.
    """
    first = timers[0]
    source = TokenSource.USAGE if output_tokens is not None else TokenSource.COUNTED
    counted = sum(t.tokens for t in timers)
    out = output_tokens if output_tokens is not None else counted
    starts = [t.first_ns for t in timers if t.first_ns is not None]
    ttft = (min(starts) - first.start_ns) / 1e9 if starts else None
    if len(timers) == 1:
        tpot = stats.tpot(first.first_ns, first.last_ns, out)
    else:
        spans = [
            ((t.last_ns - t.first_ns) / 1e9, t.tokens - 1)
            for t in timers
            if t.first_ns is not None and t.last_ns is not None and t.tokens > 1
        ]
        steps = sum(n for _, n in spans)
        tpot = sum(d for d, _ in spans) / steps if steps else None
    count = sum(t._itl_count for t in timers)
    total = sum(t._itl_sum for t in timers)
    sumsq = sum(t._itl_sumsq for t in timers)
    return StreamStats(
        operation=operation,
        model=model,
        outcome=outcome,
        status=status,
        stream=stream,
        duration_s=(end_ns - first.start_ns) / 1e9,
        ttft_s=ttft,
        tpot_s=tpot,
        input_tokens=input_tokens,
        output_tokens=out,
        token_source=source,
        chunks=sum(t.chunks for t in timers),
        itl_count=count,
        itl_sum=total,
        itl_sumsq=sumsq,
        itl_max=max(t._itl_max for t in timers),
        stalls=sum(t._stalls for t in timers),
        smoothness=stats.smoothness(count, total, sumsq),
        **extra,
    )
