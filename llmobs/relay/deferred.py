"""Work that can wait for the I/O already pending: the end-of-request bookkeeping.

When N streams end together (a batch finishing its last decode step), N handlers wake in one
loop iteration, and each would record its request (statistics, histograms, spans) before the
loop looks at its sockets again. The clients of those streams send their next requests at
once, and those wait behind the whole batch of bookkeeping: N records added to their time to
first token. Here the
bookkeeping is queued and done a slice at a time, so the loop polls its sockets, and the new
requests go upstream, between slices. The timestamps were taken when things happened, so
recording later changes no figure; it only lands a few milliseconds later at most.

Bounded: past ``max_queued`` items each new call first runs the oldest one, so a loop that
never idles cannot grow the queue, and nothing runs a long batch at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("llmobs.deferred")

SLICE_NS = 300_000  # work done per loop iteration before the loop polls its sockets again
MAX_QUEUED = 512


class Deferred:
    """A queue of calls run a slice per loop iteration, in order."""

    def __init__(self, slice_ns: int = SLICE_NS, max_queued: int = MAX_QUEUED) -> None:
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._slice_ns = slice_ns
        self._max = max_queued
        self._scheduled = False

    def __len__(self) -> int:
        return len(self._queue)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` soon, after the sockets ready now have been served."""
        queue = self._queue
        queue.append((fn, args))
        if len(queue) > self._max:
            self._one(*queue.popleft())  # full: the caller pays for the oldest
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        queue = self._queue
        clock = time.perf_counter_ns
        deadline = clock() + self._slice_ns
        while queue:
            self._one(*queue.popleft())
            if clock() >= deadline:
                break
        if queue and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def drain(self) -> None:
        """Run everything queued now (shutdown, tests)."""
        queue = self._queue
        while queue:
            self._one(*queue.popleft())

    @staticmethod
    def _one(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:  # each call guards itself; this is the last line of defence
            log.exception("deferred call %r failed", fn)
