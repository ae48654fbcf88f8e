"""How far behind the engine's prefill is: the prompts waiting for their first token, in
seconds of the pace the engine has shown, with no throughput set by hand.

A request enters the backlog when it goes upstream (a stream, or a prefill leg of
disaggregated serving, whose answer is its one token) and departs at its first token (a
prefill leg: at its answer); one that ends before abandons it. While prompts wait the engine
is serving them: from the start of a service (the queue becoming non-empty, or the previous
departure) to a departure is that departure's service time, and departures within
``GROUP_NS`` of the first are one service (an engine that prefills several prompts in one
step answers them together). Each service is a sample of how long the engine takes for so
many requests of so many prompt bytes (``ServiceFit``: a cost per request, for scheduling and
a step's overhead, and a cost per byte, for the prompt's tokens; recent samples weigh more).
The pace is the busy engine's: services that began at a departure, back to back, hold the
engine's work alone; one that began when a prompt came to an idle engine holds the prompt's
trip to it as well, and is the pace only until the engine was first seen busy.

The backlog's seconds are the fitted service of everything waiting, less what the current
service has done already: between departures they fall as the engine works, as the time
left to the last waiting prompt's first token does. A prompt is measured in bytes of its
request body, which the relay has before the engine has counted a token; its tokens are
estimated from the bytes by a second fit, against the usage the engine reports at the end.

Pure: times are arguments (the relay's monotonic clock, in ns). Limits (docs/metrics.md):
with prompts waiting the backlog is unknown (None) until a first service was seen; it
assumes the engine serves its queue in order, as vLLM's scheduler does by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from llmobs.observe.disagg import PdRole

GROUP_NS = 2_000_000  # departures this close to the first of a service are one service
MAX_PENDING = 1024  # departures (or usages) noted before they are fitted unread
# the weight a sample keeps per newer sample: the fits remember about the last 64 services
KEEP = 1.0 - 1.0 / 64
# the least spread of sizes (1 - cos² of the angle between counts and bytes) for the two
# costs to be told apart; below it one cost alone is fitted
SPREAD = 0.01


class ServiceFit:
    """``y ≈ a·u + b·x`` by least squares with exponential forgetting, ``a`` and ``b`` at
    least 0: ``u`` requests of ``x`` bytes took ``y`` (seconds, or tokens). Where the sizes
    do not vary enough to tell the two costs apart, the cost per byte alone (a prefill's
    work grows with its prompt); where one comes out negative, the other alone."""

    __slots__ = ("_uu", "_ux", "_uy", "_xx", "_xy", "samples")

    def __init__(self) -> None:
        self._uu = self._ux = self._xx = self._uy = self._xy = 0.0
        self.samples = 0

    def add(self, u: float, x: float, y: float) -> None:
        """One sample: ``u`` requests (at least one), ``x`` bytes, ``y`` their service (or
        tokens)."""
        self.extend(((u, x, y),))

    def extend(self, samples: Sequence[tuple[float, float, float]]) -> None:
        """Samples in the order they came (in local variables: a fold of many costs a
        fraction of as many ``add``)."""
        uu, ux, xx, uy, xy = self._uu, self._ux, self._xx, self._uy, self._xy
        for u, x, y in samples:
            uu = uu * KEEP + u * u
            ux = ux * KEEP + u * x
            xx = xx * KEEP + x * x
            uy = uy * KEEP + u * y
            xy = xy * KEEP + x * y
        self._uu, self._ux, self._xx, self._uy, self._xy = uu, ux, xx, uy, xy
        self.samples += len(samples)

    def costs(self) -> tuple[float, float] | None:
        """The cost per request and per byte (None: no sample yet)."""
        if not self.samples:
            return None
        uu, ux, xx, uy, xy = self._uu, self._ux, self._xx, self._uy, self._xy
        det = uu * xx - ux * ux
        if det > SPREAD * uu * xx:
            a = (uy * xx - xy * ux) / det
            b = (xy * uu - uy * ux) / det
            if a >= 0 and b >= 0:
                return a, b
            if b < 0:  # time that falls as prompts grow: a cost per request alone
                return uy / uu, 0.0
        # sizes alike (or a negative cost per request): a cost per byte alone; no byte at
        # all, a cost per request (every sample has a request: uu > 0)
        return (0.0, xy / xx) if xx > 0 else (uy / uu, 0.0)

    def predict(self, u: float, x: float) -> float | None:
        """The fitted ``y`` of ``u`` requests of ``x`` bytes (None: no sample yet)."""
        costs = self.costs()
        return None if costs is None else costs[0] * u + costs[1] * x


class Backlog(NamedTuple):
    """The backlog of one role as read at one moment."""

    requests: int  # waiting for their first token
    seconds: float | None  # the engine's fitted time to serve them (None: not known yet)
    tokens: float | None  # their prompts' estimated tokens (None: no usage seen yet)
    busy_seconds: float  # all the time so far with a prompt waiting


class PrefillBacklog:
    """The prompts of one role waiting for their first token, and the engine's fitted pace.

    A departure is only noted on the request's path (``depart``: a tuple appended); the
    services and the fits are made from the notes when the backlog is read (a scrape), or
    once ``MAX_PENDING`` are waiting, so that a request pays for no arithmetic."""

    __slots__ = ("_busy_ns", "_bytes", "_departures", "_group", "_idle", "_learnt", "_since",
                 "_started", "alone", "entered", "service", "tokens", "waiting")  # fmt: skip

    def __init__(self) -> None:
        self.waiting = 0
        self.entered = 0  # prompts that ever entered
        self._bytes = 0
        self._since = 0  # when the current service began
        self._idle = True  # ... at a prompt's arrival to an idle engine (not a departure)
        self._started = 0  # when the queue last became non-empty
        self._busy_ns = 0  # busy time of the periods that ended
        # departures not yet made into services: (its service's start, its time, its bytes,
        # whether its service began idle); prompts' (bytes, tokens) not yet fitted
        self._departures: list[tuple[int, int, int, bool]] = []
        self._learnt: list[tuple[int, int]] = []
        # the service being gathered: (its start, its first departure, its last, requests,
        # bytes, whether it began idle) (None: none)
        self._group: tuple[int, int, int, int, int, bool] | None = None
        self.service = ServiceFit()  # seconds per (requests, bytes), back to back
        self.alone = ServiceFit()  # ... of services that began idle (the trip to it in them)
        self.tokens = ServiceFit()  # prompt tokens per (requests, bytes)

    def enter(self, t_ns: int, size: int) -> None:
        """A prompt of ``size`` bytes went upstream."""
        if not self.waiting:
            self._since = self._started = t_ns
            self._idle = True
        self.waiting += 1
        self.entered += 1
        self._bytes += size

    def depart(self, t_ns: int, size: int) -> None:
        """A waiting prompt got its first token: the engine served it. ``size``: the bytes it
        entered with."""
        if not self.waiting:  # (never entered: nothing to serve)
            return
        departures = self._departures
        departures.append((self._since, t_ns, size, self._idle))
        self._since = t_ns
        self._idle = False
        waiting = self.waiting = self.waiting - 1  # (``_leave``, inline: once per request)
        self._bytes -= size
        if not waiting and t_ns > self._started:
            self._busy_ns += t_ns - self._started
        if len(departures) >= MAX_PENDING:
            self._fold(t_ns)

    def abandon(self, t_ns: int, size: int) -> None:
        """A waiting prompt's request ended with no first token: it is served by nobody."""
        if self.waiting:
            self._leave(t_ns, size)

    def learn(self, size: int, tokens: int) -> None:
        """A request of ``size`` bytes had ``tokens`` prompt tokens, as its engine counted."""
        learnt = self._learnt
        learnt.append((size, tokens))
        if len(learnt) >= MAX_PENDING:
            self._fold_tokens()

    def _leave(self, t_ns: int, size: int) -> None:
        """A prompt leaves (its size the one it entered with: its caller's own)."""
        self.waiting -= 1
        self._bytes -= size
        if not self.waiting and t_ns > self._started:
            self._busy_ns += t_ns - self._started

    def _fold(self, t_ns: int) -> None:
        """The departures noted into services, each closed into its fit: a service closes at
        a departure more than ``GROUP_NS`` after its first, or at ``t_ns`` once past that.
        (Local variables, no object per departure: a fold runs over every request.)"""
        alone: list[tuple[float, float, float]] = []
        busy: list[tuple[float, float, float]] = []
        group = self._group
        start = first = last = count = size = 0
        idle = False
        if group is not None:
            start, first, last, count, size, idle = group
        for since, at, bytes_, began_idle in self._departures:
            if count and at - first <= GROUP_NS:
                last = at
                count += 1
                size += bytes_
                continue
            if count:
                took = (last - start) / 1e9 if last > start else 0.0
                (alone if idle else busy).append((count, size, took))
            start, first, last, count, size, idle = since, at, at, 1, bytes_, began_idle
        self._departures.clear()
        if count and t_ns - first > GROUP_NS:
            took = (last - start) / 1e9 if last > start else 0.0
            (alone if idle else busy).append((count, size, took))
            count = 0
        self._group = (start, first, last, count, size, idle) if count else None
        if alone:
            self.alone.extend(alone)
        if busy:
            self.service.extend(busy)

    def _fold_tokens(self) -> None:
        if self._learnt:
            self.tokens.extend([(1, size, tokens) for size, tokens in self._learnt])
            self._learnt.clear()

    def pace(self) -> ServiceFit:
        """The fit the backlog is read by: the busy engine's once seen, else the idle's."""
        return self.service if self.service.samples else self.alone

    def read(self, t_ns: int) -> Backlog:
        """The backlog at ``t_ns``, the departures and usages noted so far fitted first."""
        self._fold(t_ns)
        self._fold_tokens()
        busy = self._busy_ns + (max(0, t_ns - self._started) if self.waiting else 0)
        if not self.waiting:  # nothing waits: no time, no tokens, whatever the pace
            return Backlog(0, 0.0, 0.0, busy / 1e9)
        work = self.pace().predict(self.waiting, self._bytes)
        seconds = None
        if work is not None:
            seconds = max(0.0, work - max(0, t_ns - self._since) / 1e9)
        tokens = self.tokens.predict(self.waiting, self._bytes)
        return Backlog(self.waiting, seconds, tokens, busy / 1e9)


class Backlogs:
    """The backlog of each P/D role on one sidecar: a role's requests share a pace (a
    decode leg's prefill is one token after its KV cache came; a prefill leg's is whole)."""

    __slots__ = ("of", "whole")

    def __init__(self) -> None:
        self.of = {role: PrefillBacklog() for role in PdRole}
        # a whole request's, the usual one: an attribute, not a probe keyed by an enum
        # member (whose hash is a Python call)
        self.whole = self.of[PdRole.WHOLE]

    def read(self, t_ns: int) -> dict[PdRole, Backlog]:
        """Each role's backlog at ``t_ns``: a whole request's always, a P/D role's once
        one of its requests came."""
        return {
            role: backlog.read(t_ns)
            for role, backlog in self.of.items()
            if backlog.entered or role is PdRole.WHOLE
        }
