"""A client connection's state, as its protocol and its request's response move it.

Apart from the protocol (``server.ServerConnection``, which reads and dispatches) as h11's
``ConnectionState`` is apart from its ``Connection``: the state and the writing, the one
place that moves them by their tables (``states.CLIENT``, ``states.WRITE``) and closes the
connection on an illegal transition, and what a request tells of its response (``began``,
``ending``): ``request.Request`` holds its connection as a ``Carrier``.
"""

from __future__ import annotations

import asyncio

from llmobs.wire.states import (
    CLIENT,
    WRITE,
    ClientEvent,
    ClientState,
    WriteEvent,
    WriteState,
    compiled,
    illegal,
)

_NEXT = compiled(CLIENT, ClientState, ClientEvent)
_WRITE_NEXT = compiled(WRITE, WriteState, WriteEvent)
_SENDING, _CLOSING, _CLOSED = ClientState.SENDING, ClientState.CLOSING, ClientState.CLOSED
_BEGIN, _BEGIN_LAST = ClientEvent.BEGIN, ClientEvent.BEGIN_LAST
_END, _CLOSE = ClientEvent.END, ClientEvent.CLOSE


class Carrier:
    """The client connection that carries requests, one at a time: its ``state``
    (``states.ClientState``) and its ``writing`` (``states.WriteState``), moved by events
    only."""

    transport: asyncio.Transport
    remote: str  # the client's address
    scheme: str  # http, or https over TLS (X-Forwarded-Proto)

    def __init__(self) -> None:
        self.state = ClientState.IDLE
        self.writing = WriteState.FLOWING

    def _go(self, event: ClientEvent) -> ClientState | None:
        """Move by ``event``; returns the state it moved to. An illegal one is a bug:
        reported (``states.illegal``), the connection closed (its handler cancelled, no one
        else's); returns None."""
        state = self.state
        after = _NEXT[state][event]
        if after is not None:
            self.state = after
            return after
        self._illegal(state, event)
        return None

    def flow(self, event: WriteEvent) -> bool:
        """Move the writing by ``event`` (``pause_writing``, ``resume_writing``), as ``_go``
        moves the state; whether it moved."""
        after = _WRITE_NEXT[self.writing][event]
        if after is None:
            self._illegal(self.writing, event)
        else:
            self.writing = after
        return after is not None

    def _illegal(self, state: ClientState | WriteState, event: ClientEvent | WriteEvent) -> None:
        illegal("client", state, event)
        if self.state is not _CLOSED:
            self.state = _CLOSING
        self.transport.abort()

    def switched(self) -> bytes:
        """The response was 101: the connection is no longer HTTP's (its transport is the
        handler's); returns what was read after the request."""
        raise NotImplementedError

    def close(self) -> None:
        """Close now (an idle timeout, the handler's abort, a shutdown)."""
        self.transport.close()
        self._go(_CLOSE)

    # -- what a request tells of its response ----------------------------------------------
    # (the table looked up in place, not through ``_go``: a call fewer per response)
    def began(self, keep: bool) -> bool:
        """The response head is being written, letting the connection carry another request
        (``keep``) or not; returns whether it does (the table's answer: not while the body is
        still coming or was refused, nor once a shutdown came)."""
        state, event = self.state, _BEGIN if keep else _BEGIN_LAST
        after = _NEXT[state][event]
        if after is None:
            self._illegal(state, event)
            return False
        self.state = after
        return after is _SENDING

    def ending(self) -> bool:
        """The response's end is being written: whether it was still to be (not before the
        response began, nor once it ended, nor on a connection closing or closed)."""
        state = self.state
        after = _NEXT[state][_END]
        if after is None or after is state:
            return False
        self.state = after
        return True
