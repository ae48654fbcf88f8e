"""The request clock: when a request went upstream and when each choice's output arrived.

The stream reader tells the clock what it read: ``output`` for a read's tokens of choice 0,
``choices`` when a read carried other choices' tokens (as ``n > 1`` streams do), and for the
usual read, one token of choice 0, it appends the time to the clock's ``tape`` itself (a call
per read would cost more than the rest of the read: docs/benchmarks.md) and calls ``full``
when the tape passes ``limit``. The clock keeps a ``StreamTimer`` per choice, hands each full
window of a long stream to ``on_window`` as it fills, and at the end gives the timers and
their last windows (``close``), from which ``timing.finish_request`` makes the request's
``RequestStats``. Times are arguments, as everywhere in observation.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping
from typing import Any

from llmobs.observe.causes import Trail
from llmobs.observe.phases import TtftPhases, split_ttft
from llmobs.observe.timing import RequestStats, StreamTimer, finish_request
from llmobs.observe.window import TokenWindow

MAX_CHOICES = 16  # n > 1: choices timed separately, beyond this pooled into the last
MAX_HOLDS = 64  # the relay's holds of the engine's reading kept per request
OPEN = 2**63  # the end of a hold that lasts


class RequestClock:
    """The times of one request: forwarded, and its output chunks per choice."""

    __slots__ = (
        "_choices",
        "_factor",
        "_first",
        "_min_gap",
        "forwarded_ns",
        "holds",
        "limit",
        "on_window",
        "output",
        "tape",
    )

    def __init__(
        self,
        start_ns: int,
        on_window: Callable[[TokenWindow], None],
        factor: float = 3.0,
        min_gap: float = 0.05,
    ) -> None:
        """``on_window`` takes each window of ITLs that fills before the request ends."""
        self._factor = factor
        self._min_gap = min_gap
        # who takes each full window (the reader drops it once the request ended)
        self.on_window = on_window
        first = self._first = StreamTimer(start_ns, factor, min_gap)  # choice 0
        self._choices: dict[int, StreamTimer] | None = None  # choices other than 0
        self.forwarded_ns: int | None = None  # when the request went upstream
        # when the relay held the engine's reading for the client: (start, end) ns, the
        # last one open (end: OPEN) while it lasts; bounded (``MAX_HOLDS``)
        self.holds: list[tuple[int, int]] = []
        # Choice 0's chunk times, the same array for the request's life: a read of one token
        # of choice 0 appends its time here, then calls ``full`` if the length passes ``limit``
        self.tape: array[int] = first.times
        self.limit = first.window
        # ``output(t_ns, tokens)``: a read of ``tokens`` output tokens of choice 0; True when
        # ``full`` is due (the timer's own method: a read's only call into the clock)
        self.output: Callable[[int, int], bool] = first.output

    def held(self, t_ns: int) -> None:
        """The relay stopped reading the engine: the client's buffer is full."""
        holds = self.holds
        if len(holds) >= MAX_HOLDS:  # the oldest go: a stall is judged against recent ones
            del holds[: MAX_HOLDS // 2]
        holds.append((t_ns, OPEN))

    def released(self, t_ns: int) -> None:
        """The relay reads the engine again."""
        holds = self.holds
        if holds and holds[-1][1] == OPEN:
            holds[-1] = (holds[-1][0], t_ns)

    def trail(self, last: int | None = None) -> Trail:
        """What choice 0 did (``causes.Trail``), for other streams' stalls: its chunk
        times so far (the tape itself, while the request runs), or with ``last``, a copy of
        at most the ``last`` latest (a memory copy: what an ended request leaves behind)."""
        first = self._first
        times = self.tape if last is None else self.tape[-last:]
        return Trail(self.forwarded_ns, first.first_ns, times, self.holds)

    def full(self) -> None:
        """Choice 0's window is full: it goes to ``on_window``."""
        self.on_window(self._first.take_window())

    def choices(self, t_ns: int, tokens: int, others: Mapping[int, int]) -> None:
        """A read of ``tokens`` output tokens of which ``others[choice]`` belong to choices
        other than 0, the rest to choice 0."""
        for choice, count in others.items():
            tokens -= count
            timer = self._timer_for(choice)
            if timer.output(t_ns, count):
                self.on_window(timer.take_window())
        if tokens > 0 and self.output(t_ns, tokens):
            self.full()

    def _timer_for(self, choice: int) -> StreamTimer:
        if choice == 0:
            return self._first
        choices = self._choices
        if choices is None:
            choices = self._choices = {}
        choice = min(choice, MAX_CHOICES)
        timer = choices.get(choice)
        if timer is None:
            timer = choices[choice] = StreamTimer(self._first.start_ns, self._factor, self._min_gap)
        return timer

    def phases(self, end_ns: int) -> tuple[int | None, int | None, int | None, int]:
        """Forwarded, first output (of any choice), last output, end: a span's phases."""
        timers = self._timers()
        firsts = [t.first_ns for t in timers if t.first_ns is not None]
        lasts = [t.last_ns for t in timers if t.last_ns is not None]
        return self.forwarded_ns, min(firsts, default=None), max(lasts, default=None), end_ns

    def ttft_phases(self, stats: RequestStats) -> TtftPhases | None:
        """The request's TTFT in phases (``phases.split_ttft``): before the engine as this
        clock saw it, the engine's own phases as ``stats`` has them; None: no first token."""
        first = self._first.first_ns
        if self._choices is not None:  # n > 1: the first token of any choice
            firsts = [t.first_ns for t in self._timers() if t.first_ns is not None]
            first = min(firsts, default=None)
        if first is None:
            return None
        start, forwarded = self._first.start_ns, self.forwarded_ns
        return split_ttft(
            first - start,
            forwarded - start if forwarded is not None else None,
            stats.engine_load_s,
            stats.engine_queue_s,
            stats.engine_prompt_eval_s,
        )

    @property
    def start_ns(self) -> int:
        """When the request arrived."""
        return self._first.start_ns

    def _timers(self) -> list[StreamTimer]:
        choices = self._choices
        return [self._first] if choices is None else [self._first, *choices.values()]

    def close(self, total_tokens: int | None) -> tuple[list[StreamTimer], list[TokenWindow]]:
        """The request ended: its timers (choice 0's first) and their last windows, for
        ``finish_request``. ``total_tokens``: the engine's own output count, spread over the
        chunks not yet taken when only one choice streamed."""
        first, choices = self._first, self._choices
        if choices is None:  # the usual request
            return [first], [first.take_window(total_tokens)]
        timers = [first, *choices.values()]
        return timers, [t.take_window(None) for t in timers]

    def counted(self, end_ns: int, **meta: Any) -> RequestStats:
        """The record from what was already taken, without the last windows: for a request
        whose observation broke, counted with its outcome all the same."""
        return finish_request([self._first], end_ns, **meta)
