"""Flow control, as both legs do it: when a connection reads, and when it yields the loop.

A connection's reading stops for two reasons, and resumes when neither is left (``Reading``):
it is held (``hold``/``release``) while what it reads has nowhere to go (the engine's
connection while its client does not read; a client's while its pipelined requests back up),
and deferred (``defer``) when it had its share of this loop turn (a read of more framing than
a decoder's budget, or a large one): the rest is decoded in the next turn, after the other
connections' reads, so one party sending tiny chunks is a slow stream, not a stall of all.
A deferred share waits while reading is held: its bytes would have nowhere to go either.

The write side is the client leg's alone (``SendTimeout``): a client that takes nothing of
its response while its transport's buffer is full is cut off, as by nginx's ``send_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable

try:
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ  # Linux's SIOCOUTQ: bytes in a socket's send queue
except (ImportError, AttributeError):  # elsewhere the send timeout sees the transport only
    _OUTQ = None


class Reading:
    """A connection's reading: held, deferred to the next loop turn, or on.

    ``defer``'s ``work`` takes the deferred share, in the next turn; it returns True while
    more is left (another turn), False when the connection may read again. It is held only
    while deferred: the connection and this hold each other no longer (no cycle outlives it).
    The transport is set once the connection has one; reading is never paused or resumed on a
    closing one.
    """

    __slots__ = ("_loop", "_turn", "_work", "deferred", "held", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._work: Callable[[], bool] | None = None  # the deferred share
        self._turn: asyncio.Handle | None = None  # the next turn, when scheduled
        self.transport: asyncio.Transport | None = None
        self.held = False  # nowhere to put what is read
        self.deferred = False  # a share of work left for the next turn; not reading until then

    def hold(self) -> None:
        """Stop reading until ``release``."""
        if not self.held:
            self.held = True
            if not self.deferred:
                self._pause()

    def release(self) -> None:
        """Read again, or first take up a deferred share (in the next turn)."""
        held, self.held = self.held, False
        if self.deferred:
            if self._turn is None:
                self._turn = self._loop.call_soon(self._next_turn)
        elif held:
            self._resume()

    def defer(self, work: Callable[[], bool]) -> None:
        """The connection had its share of this turn: stop reading, go on in the next."""
        self._work = work
        if not self.deferred:
            self.deferred = True
            if not self.held:
                self._pause()
        if self._turn is None and not self.held:
            self._turn = self._loop.call_soon(self._next_turn)

    def reset(self) -> None:
        """Nothing held or deferred any more: read (a lingering close drains what comes)."""
        self.stop()
        if self.held or self.deferred:
            self.held = self.deferred = False
            self._resume()

    def stop(self) -> None:
        """No next turn (the connection is closed, or closes)."""
        self._work = None
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.cancel()

    def _next_turn(self) -> None:
        self._turn = None
        if self.held:
            return  # ``release`` takes it up
        work = self._work
        if work is not None and work():
            self._turn = self._loop.call_soon(self._next_turn)
            return
        self._work = None
        self.deferred = False
        self._resume()

    def _pause(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def _resume(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()


class SendTimeout:
    """While writing is paused (the transport's buffer is over its high mark), a client that
    takes none of what it was sent for ``timeout`` seconds is cut off (``pause``'s
    ``on_stalled``, held only while paused: no cycle with the connection outlives it). Progress
    counts in the transport's buffer and, on Linux, the kernel's send queue: that holds up to a
    few MiB, and the transport's buffer moves only when a third of it frees, so a client reading
    steadily but slowly is seen to make progress only in the kernel's count."""

    __slots__ = ("_fd", "_left", "_loop", "_on_stalled", "_timeout", "_timer", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._loop = loop
        self._timeout = timeout
        self._on_stalled: Callable[[], None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._left = 0  # bytes the client had not taken at the last check
        self._fd = -1  # the socket, for its kernel send queue
        self.transport: asyncio.Transport | None = None

    def watch(self, transport: asyncio.Transport, fd: int) -> None:
        """The connection's transport, and its socket's descriptor (-1: none)."""
        self.transport = transport
        self._fd = fd

    def pause(self, on_stalled: Callable[[], None]) -> None:
        """Writing paused: the timeout starts."""
        self._on_stalled = on_stalled
        if self._timer is None:
            self._arm(self._unsent())

    def stop(self) -> None:
        """Writing resumed (the client caught up), or the connection is lost."""
        self._on_stalled = None
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _arm(self, left: int) -> None:
        """Check again in ``timeout`` whether the client took any of ``left`` bytes."""
        self._left = left
        self._timer = self._loop.call_later(self._timeout, self._check)

    def _check(self) -> None:
        """A client that took some of what it was sent meanwhile gets another period (a slow
        reader is not a stalled one); one that took nothing is cut off."""
        left = self._unsent()
        if left < self._left:
            self._arm(left)
            return
        self._timer = None
        on_stalled, self._on_stalled = self._on_stalled, None
        if on_stalled is not None:
            on_stalled()

    def _unsent(self) -> int:
        """Bytes written for the client that it has not taken: the transport's buffer and
        the kernel's send queue."""
        transport = self.transport
        left = transport.get_write_buffer_size() if transport is not None else 0
        if _OUTQ is not None and self._fd >= 0:
            with contextlib.suppress(OSError):
                left += struct.unpack("i", fcntl.ioctl(self._fd, _OUTQ, b"\0\0\0\0"))[0]
        return left
