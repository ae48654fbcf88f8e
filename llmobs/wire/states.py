"""Where each leg's connection is, and the events that move it: the legs' transition tables.

Pure, as h11's ``_state`` is: the states, the events and which event takes which state where,
with no I/O. Everything that decides a connection's next step is a state here, not a flag
beside it: a client connection's response (none yet, on its way, ended), whether the
connection carries another request after it (keep-alive) or closes (the response said so, or
a shutdown came), whether its client's buffer is full (paused); an engine connection's
response head (not a byte yet, part of it, all of it) and whether it may be reused. The
connection classes (``server.ServerConnection``, ``connection.Connection``) dispatch on their
state and move through the tables by named events; an event a table does not list for the
current state is a bug of ours, never the peer's (what a peer sends is an event only once the
connection accepted it). Both legs report it the same way (``illegal``): one error line on
this module's logger, and that connection closed; no exception reaches the relay's other
streams.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import IntEnum
from typing import TypeVar

log = logging.getLogger("llmobs.wire")


class ClientState(IntEnum):
    """A client connection: requests one at a time, each with its handler and its response.

    While a handler runs, the state says how far its request came (its body coming, whole, or
    refused), how far its response went (none yet, begun, ended) and what follows the response:
    the next request, the close (``_LAST``: the client or the response asked for it, or a
    shutdown), or a lingering close (the rest of the body unread).
    """

    IDLE = 0  # awaiting a request's head (the idle timer runs)
    RECEIVING = 1  # the body still coming; no response yet
    RECEIVING_LAST = 2  # ... and a shutdown came: the connection closes after the response
    RECEIVING_SENDING = 3  # the body still coming; the response begun (it says close)
    RECEIVING_SENT = 4  # the body still coming; the response ended
    HANDLING = 5  # the body whole: what comes is the next requests; no response yet
    HANDLING_LAST = 6  # ... and a shutdown came: the response will say close
    SENDING = 7  # the response begun, keep-alive: the connection carries the next request
    SENDING_LAST = 8  # the response begun; the connection closes after it
    SENT = 9  # the response ended, keep-alive (h11's DONE): the next request once it returns
    SENT_LAST = 10  # the response ended; the connection closes (h11's MUST_CLOSE)
    REFUSED = 11  # the body refused (too large, malformed): the rest dropped; no response yet
    REFUSED_SENDING = 12  # the refusal's response begun
    REFUSED_SENT = 13  # the refusal's response ended
    LINGERING = 14  # after a refusal: the answer sent, what comes drained until the close
    CLOSING = 15  # the transport is closing (ours, or found so): nothing more is read or answered
    CLOSED = 16  # the connection is lost


class ClientEvent(IntEnum):
    """What moves a client connection."""

    HEAD = 0  # a request's head came; its body is still to come
    REQUEST = 1  # a whole request came: its head, and its body if it has one
    BODY = 2  # the rest of the body came
    BAD_BODY = 3  # the body was refused: too large, or its framing broken
    BEGIN = 4  # the response head written, and it lets the connection carry another request
    BEGIN_LAST = 5  # the response head written, saying close (the client's wish, its framing)
    END = 6  # the response's end written
    SHUTDOWN = 7  # close the connection now if idle, else once the current response has ended
    DONE = 8  # the handler returned: the table says what follows (next request, close, linger)
    LINGER = 9  # a head refused before a handler: half-close, drain what comes, then close
    CLOSE = 10  # the transport closed (by the connection, or found closing)
    LOST = 11  # ``connection_lost``


_C = ClientState
_CE = ClientEvent
# the end of a connection is legal from anywhere, and more than once
_CLIENT_ENDS = {_CE.CLOSE: _C.CLOSING, _CE.LOST: _C.CLOSED}
# a response written to a connection already closing: nothing to move (the client is gone)
_WRITTEN_TO_CLOSED = {_CE.BEGIN: _C.CLOSING, _CE.BEGIN_LAST: _C.CLOSING, _CE.END: _C.CLOSING}

CLIENT: Mapping[ClientState, Mapping[ClientEvent, ClientState]] = {
    _C.IDLE: {
        _CE.HEAD: _C.RECEIVING,
        _CE.REQUEST: _C.HANDLING,
        _CE.BAD_BODY: _C.REFUSED,  # refused in the read that brought its head
        _CE.LINGER: _C.LINGERING,  # a head that cannot be parsed
        _CE.SHUTDOWN: _C.CLOSING,
        **_CLIENT_ENDS,
    },
    # the body still coming: a response begun now says close (its end is unknown), and once
    # it ends the rest of the body is drained (a lingering close), unless it came meanwhile
    _C.RECEIVING: {
        _CE.BODY: _C.HANDLING,
        _CE.BAD_BODY: _C.REFUSED,
        _CE.BEGIN: _C.RECEIVING_SENDING,
        _CE.BEGIN_LAST: _C.RECEIVING_SENDING,
        _CE.SHUTDOWN: _C.RECEIVING_LAST,
        **_CLIENT_ENDS,
    },
    _C.RECEIVING_LAST: {
        _CE.BODY: _C.HANDLING_LAST,
        _CE.BAD_BODY: _C.REFUSED,
        _CE.BEGIN: _C.RECEIVING_SENDING,
        _CE.BEGIN_LAST: _C.RECEIVING_SENDING,
        _CE.SHUTDOWN: _C.RECEIVING_LAST,
        **_CLIENT_ENDS,
    },
    _C.RECEIVING_SENDING: {
        _CE.BODY: _C.SENDING_LAST,
        _CE.BAD_BODY: _C.REFUSED_SENDING,
        _CE.END: _C.RECEIVING_SENT,
        _CE.SHUTDOWN: _C.RECEIVING_SENDING,
        _CE.DONE: _C.CLOSING,  # cut short: the client must not take it for a whole response
        **_CLIENT_ENDS,
    },
    _C.RECEIVING_SENT: {
        _CE.BODY: _C.SENT_LAST,
        _CE.BAD_BODY: _C.REFUSED_SENT,
        _CE.SHUTDOWN: _C.RECEIVING_SENT,
        _CE.DONE: _C.LINGERING,  # the rest of the body never read
        **_CLIENT_ENDS,
    },
    # the body whole: a response may keep the connection, unless a shutdown came
    _C.HANDLING: {
        _CE.BEGIN: _C.SENDING,
        _CE.BEGIN_LAST: _C.SENDING_LAST,
        _CE.SHUTDOWN: _C.HANDLING_LAST,
        **_CLIENT_ENDS,
    },
    _C.HANDLING_LAST: {
        _CE.BEGIN: _C.SENDING_LAST,
        _CE.BEGIN_LAST: _C.SENDING_LAST,
        _CE.SHUTDOWN: _C.HANDLING_LAST,
        **_CLIENT_ENDS,
    },
    _C.SENDING: {
        _CE.END: _C.SENT,
        _CE.SHUTDOWN: _C.SENDING_LAST,
        _CE.DONE: _C.CLOSING,  # cut short
        **_CLIENT_ENDS,
    },
    _C.SENDING_LAST: {
        _CE.END: _C.SENT_LAST,
        _CE.SHUTDOWN: _C.SENDING_LAST,
        _CE.DONE: _C.CLOSING,  # cut short
        **_CLIENT_ENDS,
    },
    _C.SENT: {_CE.SHUTDOWN: _C.SENT_LAST, _CE.DONE: _C.IDLE, **_CLIENT_ENDS},
    _C.SENT_LAST: {_CE.SHUTDOWN: _C.SENT_LAST, _CE.DONE: _C.CLOSING, **_CLIENT_ENDS},
    # refused: the response says close, and the rest of the body is drained after it
    _C.REFUSED: {
        _CE.BEGIN: _C.REFUSED_SENDING,
        _CE.BEGIN_LAST: _C.REFUSED_SENDING,
        _CE.SHUTDOWN: _C.REFUSED,
        **_CLIENT_ENDS,
    },
    _C.REFUSED_SENDING: {
        _CE.END: _C.REFUSED_SENT,
        _CE.SHUTDOWN: _C.REFUSED_SENDING,
        _CE.DONE: _C.CLOSING,  # cut short
        **_CLIENT_ENDS,
    },
    _C.REFUSED_SENT: {_CE.SHUTDOWN: _C.REFUSED_SENT, _CE.DONE: _C.LINGERING, **_CLIENT_ENDS},
    _C.LINGERING: {_CE.SHUTDOWN: _C.CLOSING, **_CLIENT_ENDS},
    # a handler still running when the transport closed: its response and its end move nothing
    # (a handler cancelled by the loss still ends, and closes, after it)
    _C.CLOSING: {_CE.SHUTDOWN: _C.CLOSING, **_WRITTEN_TO_CLOSED, **_CLIENT_ENDS},
    _C.CLOSED: {
        _CE.SHUTDOWN: _C.CLOSED,
        _CE.BEGIN: _C.CLOSED,
        _CE.BEGIN_LAST: _C.CLOSED,
        _CE.END: _C.CLOSED,
        _CE.CLOSE: _C.CLOSED,
    },
}

# what a read is, by state: the current request's body, or the next requests (else dropped)
CLIENT_RECEIVING = frozenset(
    {_C.RECEIVING, _C.RECEIVING_LAST, _C.RECEIVING_SENDING, _C.RECEIVING_SENT}
)
CLIENT_HANDLING = frozenset(
    {_C.HANDLING, _C.HANDLING_LAST, _C.SENDING, _C.SENDING_LAST, _C.SENT, _C.SENT_LAST}
)
# a handler runs and no response has begun (one returning so gets a 500)
CLIENT_UNANSWERED = frozenset(
    {_C.RECEIVING, _C.RECEIVING_LAST, _C.HANDLING, _C.HANDLING_LAST, _C.REFUSED}
)


class WriteState(IntEnum):
    """A client connection's writing: its transport's buffer under its high mark, or over."""

    FLOWING = 0
    PAUSED = 1  # over the high mark: the handler's source paused, the send timeout running


class WriteEvent(IntEnum):
    """What moves a client connection's writing (``pause_writing``, ``resume_writing``)."""

    PAUSE = 0
    RESUME = 1


WRITE: Mapping[WriteState, Mapping[WriteEvent, WriteState]] = {
    WriteState.FLOWING: {WriteEvent.PAUSE: WriteState.PAUSED},
    WriteState.PAUSED: {WriteEvent.RESUME: WriteState.FLOWING},
}


class EngineState(IntEnum):
    """An upstream connection: one exchange at a time. Ordered: from ``SPENT`` on it carries
    none."""

    IDLE = 0  # no exchange: new, or pooled after a response that left it fit for another
    SENT = 1  # a request written; nothing of its response yet
    ANSWERING = 2  # part of its response head came (or interim ones): a retry would repeat it
    RELAYING = 3  # the head came, keep-alive: the body relayed; the connection reused after it
    RELAYING_LAST = 4  # the head came, forbidding reuse: the connection is spent after the body
    SPENT = 5  # carries no more: a response that forbade reuse, a failure, or closed by us
    UNANSWERED = 6  # the engine closed it with a request sent and no byte of its response
    CLOSED = 7  # the transport is gone


class EngineEvent(IntEnum):
    """What moves an upstream connection."""

    SEND = 0  # a request written
    PART = 1  # part of its response head came, or an interim response (1xx)
    HEAD = 2  # its response head came, and it lets the connection carry another request
    HEAD_LAST = 3  # its response head came, forbidding reuse (close, or read until close)
    END = 4  # the response ended: reused or spent, as its head said
    RETIRE = 5  # the exchange failed or ended unfit for reuse, or the connection is closed
    LOST = 6  # ``connection_lost``


_E = EngineState
_EE = EngineEvent
_ENGINE_ENDS = {_EE.RETIRE: _E.SPENT, _EE.LOST: _E.CLOSED}
_HEADS = {_EE.PART: _E.ANSWERING, _EE.HEAD: _E.RELAYING, _EE.HEAD_LAST: _E.RELAYING_LAST}

ENGINE: Mapping[EngineState, Mapping[EngineEvent, EngineState]] = {
    _E.IDLE: {_EE.SEND: _E.SENT, **_ENGINE_ENDS},
    # closed before a byte of the response: the engine may never have read the request (a
    # pooled connection it closed meanwhile), so an idempotent one may go again
    _E.SENT: {**_HEADS, **_ENGINE_ENDS, _EE.LOST: _E.UNANSWERED},
    _E.ANSWERING: {**_HEADS, **_ENGINE_ENDS},
    _E.RELAYING: {_EE.END: _E.IDLE, **_ENGINE_ENDS},
    _E.RELAYING_LAST: {_EE.END: _E.SPENT, **_ENGINE_ENDS},
    _E.SPENT: dict(_ENGINE_ENDS),
    # closed again, or a late failure: nothing to undo
    _E.UNANSWERED: {_EE.RETIRE: _E.UNANSWERED},
    _E.CLOSED: {_EE.RETIRE: _E.CLOSED},
}


class IllegalTransition(Exception):
    """An event the table does not allow in the current state: a bug of ours."""

    def __init__(self, leg: str, state: IntEnum, event: IntEnum) -> None:
        super().__init__(f"{leg} connection: {event.name} in state {state.name}")
        self.leg = leg
        self.state = state
        self.event = event


def illegal(leg: str, state: IntEnum, event: IntEnum) -> IllegalTransition:
    """Report an illegal transition, as both legs do: one error line (the error attached to
    the record as ``illegal``, for whoever counts them); returns the error, which the caller
    closes its connection with."""
    error = IllegalTransition(leg, state, event)
    log.error("%s is not a transition (a bug): closing it", error, extra={"illegal": error})
    return error


S = TypeVar("S", bound=IntEnum)
E = TypeVar("E", bound=IntEnum)


def compiled(
    table: Mapping[S, Mapping[E, S]], states: type[S], events: type[E]
) -> tuple[tuple[S | None, ...], ...]:
    """``table`` as rows indexed by state, then event (None: illegal): what a connection
    looks up per transition, two indexings instead of a call and two dict probes."""
    assert [int(s) for s in states] == list(range(len(states)))
    assert [int(e) for e in events] == list(range(len(events)))
    return tuple(tuple(table[s].get(e) for e in events) for s in states)
