"""Timing: output-chunk timestamps of one request -> windows of ITLs and a final RequestStats.

Time is an argument: the proxy reads the clock once per chunk (``time.perf_counter_ns``) and
passes it in; nothing here reads a clock, so tests drive it with literal timestamps.

Per chunk the timer only appends the time to a compact array (8 bytes) and adds the tokens
to a counter; the rarer chunk of other than one token also leaves its index and count.
Statistics run once at the end of the request in ``stats``; only a stream longer than
``window`` chunks (65536 by default, 0.5-1 MiB) is cut into windows that the caller takes
(``take_window``) and
hands to the sinks as they fill, which keeps memory bounded. The window is large because the
engine's final ``usage`` can only be spread over chunks not yet taken.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from llmobs.observe import stats
from llmobs.observe.window import EMPTY_WINDOW, TokenWindow


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


class RequestStats(NamedTuple):
    """The finished record of one request, handed to every sink.

    A named tuple, for the reason docs/architecture.md gives ("Records are named tuples").
    Nothing relies on it being a tuple; compare records field by field.
    """

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
    finish_reason: str = "none"  # the bounded label: the first normalized reason seen
    reasoning_tokens: int | None = None
    reasoning_source: TokenSource = TokenSource.USAGE
    cached_tokens: int | None = None
    engine_prompt_eval_s: float | None = None  # durations only the engine knows (Ollama)
    engine_load_s: float | None = None
    dialect: str = "openai"
    engine_queue_s: float | None = None  # the engine's queue as it reports it (vLLM metrics)
    grpc_status: int | None = None  # a gRPC call's status code (None: not gRPC, or not said)


def unparsed(status: int, duration_s: float) -> RequestStats:
    """The record of a request the server refused before it could be parsed (a malformed
    head: 400, 431, 501, 505): no route, no model, nothing relayed; its outcome is ``rejected``."""
    return RequestStats(
        "other", None, Outcome.REJECTED, status, False, duration_s, None, None, None, 0,
        TokenSource.COUNTED, 0, 0.0, 0.0, 0.0, 0.0, 0, None, dialect="none",
    )  # fmt: skip


class StreamTimer:
    """Collects output-chunk times of one request; windows of ITLs; the final stats."""

    __slots__ = (
        "_base",
        "_extra",
        "_first",
        "_head",
        "_itl_count",
        "_itl_max",
        "_itl_sum",
        "_itl_sumsq",
        "_median",
        "_odd",
        "_stalls",
        "_taken",
        "factor",
        "flushed_tokens",
        "min_gap",
        "small",
        "start_ns",
        "times",
        "window",
    )

    def __init__(
        self,
        start_ns: int,
        factor: float = 3.0,
        min_gap: float = 0.05,
        *,
        window: int = 65536,
        small: int = stats.SMALL,
    ) -> None:
        self.start_ns = start_ns
        self.factor = factor
        self.min_gap = min_gap
        self.window = window
        self.small = small  # windows of fewer gaps go through ``stats.small_window``
        self.flushed_tokens = 0  # tokens of chunks already taken in windows
        # Anchor (previous window's last chunk) + this window's chunks, one array for the
        # request's life. Appending a time here is ``output(t, 1)`` (the stream reader's hot
        # path does it itself, ``RequestClock.tape``): chunks of one token are counted by
        # their times alone; ``_extra`` adds what other counts differ by.
        # unsigned: array's signed setitem parses each int with a format string, which makes
        # an append a third dearer (times from perf_counter_ns are never negative)
        self.times = array("Q")
        self._extra = 0
        # (index in times, tokens) of this window's chunks after the first that carried
        # other than one token, flat; None while there are none (the usual case)
        self._odd: array[int] | None = None
        self._head = 1  # the first chunk's tokens
        self._base = 0  # chunks in taken windows, less the anchor that times still holds
        self._first = 0  # the first chunk's time, once a window was taken
        self._median: float | None = None
        self._stalls = 0
        self._taken = False  # a window was taken: the first chunk is accounted
        self._itl_count = 0.0
        self._itl_sum = 0.0
        self._itl_sumsq = 0.0
        self._itl_max = 0.0

    def output(self, t_ns: int, tokens: int) -> bool:
        """Record a chunk of ``tokens`` output tokens at ``t_ns``; True when the window is full
        (``take_window`` is due). Once per output chunk: one append; the first and last times,
        the chunk count and (for one-token chunks) the tokens are read off the times."""
        times = self.times
        times.append(t_ns)
        if tokens != 1:
            self._extra += tokens - 1
            self._count(len(times) - 1, tokens)
        return len(times) > self.window

    @property
    def tokens(self) -> int:
        """Output tokens counted so far (chunk counts or per-chunk usage)."""
        return self._base + len(self.times) + self._extra

    def _count(self, index: int, tokens: int) -> None:
        """A chunk of other than one token at ``index`` in the window's times."""
        if index == 0:  # the very first chunk (later windows start with their anchor)
            self._head = tokens
            return
        odd = self._odd
        if odd is None:
            odd = self._odd = array("q")
        odd.append(index)
        odd.append(tokens)

    @property
    def first_ns(self) -> int | None:
        """When the first output chunk arrived; None before any."""
        if self._taken:
            return self._first
        return self.times[0] if self.times else None

    @property
    def last_ns(self) -> int | None:
        """When the latest output chunk arrived; None before any."""
        return self.times[-1] if self.times else None

    @property
    def chunks(self) -> int:
        """Output chunks recorded so far."""
        return self._base + len(self.times)

    def take_window(self, total_tokens: int | None = None) -> TokenWindow:
        """ITLs of the chunks recorded since the last window; keeps the last as the anchor.

        ``total_tokens`` (final call only): the engine's own output count when chunk counts
        were only assumed (one per chunk); it is spread evenly over the chunks not yet taken.
        Fewer than ``small`` chunks go through ``stats.small_window`` (plain Python), more
        through ``stats.token_window`` (numpy): the same numbers either way.
        """
        times = self.times
        chunks = len(times) - 1  # the first is the anchor (or the first chunk, not timed)
        if chunks < 1:
            return EMPTY_WINDOW
        first_window = not self._taken
        if first_window:
            self._taken = True
            self._first = times[0]
        head = self._head if first_window else 0  # the first chunk keeps its count
        odd = self._odd
        small = chunks < self.small
        pending: list[float] | npt.NDArray[np.float64] | None = None
        if total_tokens is None:
            spread = self.tokens - self.flushed_tokens - head  # what the chunks after add up to
            if odd is not None:  # the chunks' own counts
                pending = [1.0] * chunks if small else np.ones(chunks)
                for i in range(0, len(odd), 2):
                    pending[odd[i] - 1] = float(odd[i + 1])
        else:
            rest = max(total_tokens - (head if first_window else self.flushed_tokens), 0)
            base, extra = divmod(rest, chunks)
            spread = rest
            if not (base == 0 or (base == 1 and extra == 0)):  # weights max(count, 1) not ones
                pending = (
                    stats.spread_list(rest, chunks) if small else stats.spread_tokens(rest, chunks)
                )
        if small:
            window = stats.small_window(
                times.tolist(),
                pending if isinstance(pending, list) else None,
                factor=self.factor,
                min_gap=self.min_gap,
                baseline_median=self._median,
            )
        else:
            window = stats.token_window(
                # the same bytes (times are < 2**63), copied: ``times`` is kept and cut below
                np.frombuffer(times, dtype=np.int64).copy(),
                pending if isinstance(pending, np.ndarray) else None,
                factor=self.factor,
                min_gap=self.min_gap,
                baseline_median=self._median,
            )
        self._median = window.median_gap
        self._stalls += window.stalls
        self._itl_count += window.tokens
        self._itl_sum += window.itl_sum
        self._itl_sumsq += window.itl_sumsq
        self._itl_max = max(self._itl_max, window.itl_max)
        self.flushed_tokens += spread + head
        self._base += chunks
        del times[:-1]  # in place: the array stays the one the reader appends to
        self._odd = None
        return window

    def finish(self, end_ns: int, **meta: Any) -> RequestStats:
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
    response_model: str | None = None,
    response_id: str | None = None,
    finish_reasons: tuple[str, ...] = (),
    finish_reason: str = "none",
    reasoning_tokens: int | None = None,
    reasoning_source: TokenSource = TokenSource.USAGE,
    cached_tokens: int | None = None,
    engine_prompt_eval_s: float | None = None,
    engine_load_s: float | None = None,
    dialect: str = "openai",
    engine_queue_s: float | None = None,
    grpc_status: int | None = None,
) -> RequestStats:
    """The request's record from its choices' timers (one, or one per choice for n > 1).

    Call after each timer's final ``take_window``. TTFT is the first token of any choice;
    ITL sums, stalls and smoothness pool every choice's tokens; TPOT is the pooled decode
    time over the pooled tokens after each choice's first.
    """
    first = timers[0]
    source = TokenSource.USAGE if output_tokens is not None else TokenSource.COUNTED
    if len(timers) == 1:  # the usual request: no pooling
        start, last = first.first_ns, first.last_ns
        out = output_tokens if output_tokens is not None else first.tokens
        ttft = (start - first.start_ns) / 1e9 if start is not None else None
        tpot = stats.tpot(start, last, out)
        chunks = first.chunks
        count, total, sumsq = first._itl_count, first._itl_sum, first._itl_sumsq
        itl_max, stalls = first._itl_max, first._stalls
    else:
        counted = sum(t.tokens for t in timers)
        out = output_tokens if output_tokens is not None else counted
        starts = [t.first_ns for t in timers if t.first_ns is not None]
        ttft = (min(starts) - first.start_ns) / 1e9 if starts else None
        spans = [
            ((last_ns - first_ns) / 1e9, t.tokens - 1)
            for t in timers
            if (first_ns := t.first_ns) is not None
            and (last_ns := t.last_ns) is not None
            and t.tokens > 1
        ]
        steps = sum(n for _, n in spans)
        tpot = sum(d for d, _ in spans) / steps if steps else None
        chunks = sum(t.chunks for t in timers)
        count = sum(t._itl_count for t in timers)
        total = sum(t._itl_sum for t in timers)
        sumsq = sum(t._itl_sumsq for t in timers)
        itl_max = max(t._itl_max for t in timers)
        stalls = sum(t._stalls for t in timers)
    return RequestStats(
        operation,
        model,
        outcome,
        status,
        stream,
        (end_ns - first.start_ns) / 1e9,  # duration_s
        ttft,
        tpot,
        input_tokens,
        out,
        source,
        chunks,
        count,
        total,
        sumsq,
        itl_max,
        stalls,
        stats.smoothness(count, total, sumsq),
        response_model,
        response_id,
        finish_reasons,
        finish_reason,
        reasoning_tokens,
        reasoning_source,
        cached_tokens,
        engine_prompt_eval_s,
        engine_load_s,
        dialect,
        engine_queue_s,
        grpc_status,
    )
