"""A WebSocket's two legs once the engine answered 101: bytes both ways, unchanged, within the
sidecar's limits.

After the handshake neither connection is HTTP's any more: each transport's protocol becomes
a ``Leg`` of one ``Tunnel``, which passes what one leg reads to the other, first and
unchanged, then hands the messages that ended to its owner (``on_messages``: observation).
Its limits, as a reverse proxy's tunnel and the engine's own server keep them:
- a message over the limit (``websocket.FrameReader``): the bytes before it pass, then the
  session ends, with a 1009 close frame to each side whose stream is at a frame's start;
- ``idle_timeout`` seconds with nothing read either way: ended, 1001 to both;
- a full buffer either way pauses the other leg's reading; a client that takes nothing it
  was sent for ``client_timeout`` meanwhile is cut off (``flow.SendTimeout``);
- either leg closing closes the other, after what it was sent has gone (or ``LINGER``).
It ends once (``ended``), for one reason from a closed set (``Ending``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
from collections.abc import Callable

from llmobs.wire.flow import SendTimeout
from llmobs.wire.websocket import GOING_AWAY, TOO_BIG, FrameReader, Message, close_frame

log = logging.getLogger("llmobs.tunnel")

CLIENT, ENGINE = 0, 1  # the legs, and the direction of what each reads
LINGER = 2.0  # seconds a closed leg may take to flush what it was sent, then it is dropped

OnMessages = Callable[[int, list[Message]], None]


class Ending(enum.StrEnum):
    """Why a tunnel ended."""

    CLIENT_CLOSED = "client_closed"  # the client's connection ended
    ENGINE_CLOSED = "engine_closed"  # the engine's connection ended
    IDLE = "idle"  # nothing either way for the idle timeout
    TOO_LARGE = "too_large"  # a message over the limit
    CLIENT_STALLED = "client_stalled"  # the client took nothing for the client timeout
    CLOSED = "closed"  # its owner closed it (a shutdown)


class Leg(asyncio.Protocol):
    """One side of a tunnel: its transport's events, told to the tunnel with the side."""

    __slots__ = ("_side", "_tunnel")

    def __init__(self, tunnel: Tunnel, side: int) -> None:
        self._tunnel = tunnel
        self._side = side

    def data_received(self, data: bytes) -> None:
        self._tunnel.received(self._side, data)

    def eof_received(self) -> bool:
        self._tunnel.lost(self._side)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._tunnel.lost(self._side)

    def pause_writing(self) -> None:
        self._tunnel.full(self._side)

    def resume_writing(self) -> None:
        self._tunnel.drained(self._side)


class Tunnel:
    """The client's and the engine's transports, joined: see the module's docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transports: tuple[asyncio.Transport, asyncio.Transport],
        readers: tuple[FrameReader, FrameReader],
        *,
        idle_timeout: float,
        client_timeout: float,
        on_messages: OnMessages | None = None,
    ) -> None:
        """``transports`` and ``readers``: the client's, then the engine's (the reader of
        what that side sends)."""
        self._loop = loop
        self._transports = transports
        self._readers = readers
        self._on_messages = on_messages
        self._idle_timeout = idle_timeout
        self._last = loop.time()
        self._timer: asyncio.TimerHandle | None = loop.call_later(idle_timeout, self._idle)
        self._sending = SendTimeout(loop, client_timeout)
        self.ended: asyncio.Future[Ending] = loop.create_future()
        self.bytes = [0, 0]  # passed on, by the side that sent them

    def start(self, client_rest: bytes, engine_rest: bytes) -> None:
        """Take both transports over; what each side sent after the handshake (read with
        it) goes on first."""
        client, engine = self._transports
        sock = client.get_extra_info("socket")
        fd = sock.fileno() if isinstance(sock, socket.socket) else -1
        self._sending.watch(client, fd)
        for side, transport in enumerate(self._transports):
            transport.set_protocol(Leg(self, side))
        if engine_rest:
            self.received(ENGINE, engine_rest)
        if client_rest:
            self.received(CLIENT, client_rest)
        for transport in self._transports:
            if not transport.is_closing():
                transport.resume_reading()
        if client.is_closing() or engine.is_closing():
            self.lost(CLIENT if client.is_closing() else ENGINE)

    # -- the legs' events -------------------------------------------------------------------
    def received(self, side: int, data: bytes) -> None:
        """Bytes from ``side``: to the other side first, then to observation."""
        if self.ended.done():
            return
        self._last = self._loop.time()
        reader = self._readers[side]
        passed = reader.feed(data)
        other = self._transports[1 - side]
        if passed:
            other.write(data if passed == len(data) else data[:passed])
            self.bytes[side] += passed
        messages = reader.messages
        if messages:
            reader.messages = []
            self._tell(side, messages)
        if passed < len(data):
            self._end(Ending.TOO_LARGE, TOO_BIG, "message too big")

    def _tell(self, side: int, messages: list[Message]) -> None:
        on_messages = self._on_messages
        if on_messages is not None:
            try:
                on_messages(side, messages)
            except Exception:  # observation's failure: the tunnel carries on
                log.exception("observing a WebSocket's messages failed")

    def lost(self, side: int) -> None:
        """``side``'s connection ended: the other is closed, once it has what it was sent."""
        self._end(Ending.CLIENT_CLOSED if side == CLIENT else Ending.ENGINE_CLOSED)

    def full(self, side: int) -> None:
        """``side``'s buffer is full: the other side is not read until it drains."""
        other = self._transports[1 - side]
        if not other.is_closing():
            other.pause_reading()
        if side == CLIENT:
            self._sending.pause(self._stalled)

    def drained(self, side: int) -> None:
        other = self._transports[1 - side]
        if not other.is_closing():
            other.resume_reading()
        if side == CLIENT:
            self._sending.stop()

    def _stalled(self) -> None:
        self._end(Ending.CLIENT_STALLED, GOING_AWAY, "client stalled")

    def _idle(self) -> None:
        self._timer = None
        if self.ended.done():
            return
        left = self._last + self._idle_timeout - self._loop.time()
        if left > 0:
            self._timer = self._loop.call_later(left, self._idle)
            return
        self._end(Ending.IDLE, GOING_AWAY, "idle")

    # -- the end ----------------------------------------------------------------------------
    def close(self) -> None:
        """End it now (its owner's shutdown): 1001 to both sides."""
        self._end(Ending.CLOSED, GOING_AWAY, "going away")

    def _end(self, ending: Ending, code: int = 0, reason: str = "") -> None:
        """End once: a close frame with ``code`` to each side whose stream is at a frame's
        start (none for ``code`` 0), then both closed; dropped after ``LINGER`` if not
        flushed by then (a stalled client at once)."""
        if self.ended.done():
            return
        self.ended.set_result(ending)
        if code:
            self._farewell(code, reason, to_client=ending is not Ending.CLIENT_STALLED)
        self._sending.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if ending is Ending.CLIENT_STALLED:
            self._transports[CLIENT].abort()
        for transport in self._transports:
            transport.close()
        self._loop.call_later(LINGER, _drop, self._transports)

    def _farewell(self, code: int, reason: str, *, to_client: bool) -> None:
        """A close frame to each side whose stream is at a frame's start (masked to the
        engine, as a client's must be)."""
        client, engine = self._transports
        client_reader, engine_reader = self._readers
        if to_client and not client.is_closing() and engine_reader.between and engine_reader.clean:
            client.write(close_frame(code, reason, masked=False))
        if not engine.is_closing() and client_reader.between and client_reader.clean:
            engine.write(close_frame(code, reason, masked=True))


def _drop(transports: tuple[asyncio.Transport, asyncio.Transport]) -> None:
    """What a closed leg has not flushed by now is dropped (a client that stopped reading)."""
    for transport in transports:
        with contextlib.suppress(Exception):
            transport.abort()
