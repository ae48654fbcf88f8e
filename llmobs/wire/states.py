"""Where each leg's connection is, and the events that move it: one table per leg.

Pure, as h11's ``_state`` is: the states, the events and which event takes which state where,
with no I/O. The connection classes (``server.ServerConnection``, ``upstream.Connection``)
dispatch on their state and move through the table by named events; an event the table does
not list for the current state is a bug of ours, never the peer's (what a peer sends is an
event only once the connection accepted it). The connections catch it: it is logged as an error,
the connection is closed, and no exception reaches the relay's other streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import TypeVar


class ClientState(IntEnum):
    """A client connection: requests one at a time, each with its handler."""

    IDLE = 0  # awaiting a request's head (the idle timer runs)
    RECEIVING = 1  # a handler runs; the request's body is still coming
    HANDLING = 2  # a handler runs; the body is whole: what comes is the next requests
    REFUSED = 3  # a handler runs; the body was refused (too large, malformed): the rest dropped
    LINGERING = 4  # after a refusal: the answer sent, what comes drained until the close
    CLOSING = 5  # the transport is closing (ours, or found so): nothing more is read or answered
    CLOSED = 6  # the connection is lost


class ClientEvent(IntEnum):
    """What moves a client connection."""

    HEAD = 0  # a request's head came; its body is still to come
    REQUEST = 1  # a whole request came: its head, and its body if it has one
    BODY = 2  # the rest of the body came
    BAD_BODY = 3  # the body was refused: too large, or its framing broken
    DONE = 4  # the response ended and the connection carries the next request
    LINGER = 5  # a refusal: half-close, drain what comes, then close
    CLOSE = 6  # the transport closed (by the connection, or found closing)
    LOST = 7  # ``connection_lost``


_C = ClientState
_CE = ClientEvent
# the end of a connection is legal from anywhere, and more than once
_CLIENT_ENDS = {_CE.CLOSE: _C.CLOSING, _CE.LOST: _C.CLOSED}

CLIENT: Mapping[ClientState, Mapping[ClientEvent, ClientState]] = {
    _C.IDLE: {
        _CE.HEAD: _C.RECEIVING,
        _CE.REQUEST: _C.HANDLING,
        _CE.BAD_BODY: _C.REFUSED,  # refused in the read that brought its head
        _CE.LINGER: _C.LINGERING,  # a head that cannot be parsed
        **_CLIENT_ENDS,
    },
    _C.RECEIVING: {
        _CE.BODY: _C.HANDLING,
        _CE.BAD_BODY: _C.REFUSED,
        _CE.LINGER: _C.LINGERING,  # the handler ended without reading the body
        **_CLIENT_ENDS,
    },
    _C.HANDLING: {_CE.DONE: _C.IDLE, **_CLIENT_ENDS},
    _C.REFUSED: {_CE.LINGER: _C.LINGERING, **_CLIENT_ENDS},
    _C.LINGERING: dict(_CLIENT_ENDS),
    _C.CLOSING: dict(_CLIENT_ENDS),
    # a handler cancelled by the loss still ends (and closes) after it
    _C.CLOSED: {_CE.CLOSE: _C.CLOSED},
}

# a handler runs (the connection holds a request)
CLIENT_BUSY = frozenset({_C.RECEIVING, _C.HANDLING, _C.REFUSED})


class EngineState(IntEnum):
    """An upstream connection: one exchange at a time. Ordered: from ``SPENT`` on it carries
    none."""

    IDLE = 0  # no exchange: new, or pooled after a response that left it fit for another
    SENT = 1  # a request written; its response head awaited
    RELAYING = 2  # the head came; the body is relayed as it comes
    SPENT = 3  # carries no more: a response that forbade reuse, a failure, or closed by us
    CLOSED = 4  # the transport is gone


class EngineEvent(IntEnum):
    """What moves an upstream connection."""

    SEND = 0  # a request written
    HEAD = 1  # its response head came
    END = 2  # the response ended, and the connection may carry another request
    RETIRE = 3  # the exchange failed or ended unfit for reuse, or the connection is closed
    LOST = 4  # ``connection_lost``


_E = EngineState
_EE = EngineEvent
_ENGINE_ENDS = {_EE.RETIRE: _E.SPENT, _EE.LOST: _E.CLOSED}

ENGINE: Mapping[EngineState, Mapping[EngineEvent, EngineState]] = {
    _E.IDLE: {_EE.SEND: _E.SENT, **_ENGINE_ENDS},
    _E.SENT: {_EE.HEAD: _E.RELAYING, **_ENGINE_ENDS},
    _E.RELAYING: {_EE.END: _E.IDLE, **_ENGINE_ENDS},
    _E.SPENT: dict(_ENGINE_ENDS),
    _E.CLOSED: {_EE.RETIRE: _E.CLOSED},  # closed again, or a late failure: nothing to undo
}


class IllegalTransition(Exception):
    """An event the table does not allow in the current state: a bug of ours."""

    def __init__(self, leg: str, state: IntEnum, event: IntEnum) -> None:
        super().__init__(f"{leg} connection: {event.name} in state {state.name}")
        self.leg = leg
        self.state = state
        self.event = event


S = TypeVar("S", bound=IntEnum)
E = TypeVar("E", bound=IntEnum)


def next_state(leg: str, table: Mapping[S, Mapping[E, S]], state: S, event: E) -> S:
    """The state ``event`` takes ``state`` to; ``IllegalTransition`` if none."""
    after = table[state].get(event)
    if after is None:
        raise IllegalTransition(leg, state, event)
    return after


def compiled(
    table: Mapping[S, Mapping[E, S]], states: type[S], events: type[E]
) -> tuple[tuple[S | None, ...], ...]:
    """``table`` as rows indexed by state, then event (None: illegal): what a connection
    looks up per transition, two indexings instead of a call and two dict probes."""
    assert [int(s) for s in states] == list(range(len(states)))
    assert [int(e) for e in events] == list(range(len(events)))
    return tuple(tuple(table[s].get(e) for e in events) for s in states)
