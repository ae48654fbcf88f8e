"""The legs' transition tables (``wire/states.py``): every legal transition compiled as the
table says and every illegal one refused; what follows a response read from the state alone
(keep-alive, close, lingering close, a shutdown's close); the one report of an illegal
transition; and one in a live connection caught: reported, that connection closed, the others
served."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from enum import IntEnum
from typing import TypeVar

import pytest

from llmobs.wire.http1 import ResponseHead
from llmobs.wire.server import Request
from llmobs.wire.states import (
    CLIENT,
    CLIENT_UNANSWERED,
    ENGINE,
    WRITE,
    ClientEvent,
    ClientState,
    EngineEvent,
    EngineState,
    IllegalTransition,
    WriteEvent,
    WriteState,
    compiled,
)
from llmobs.wire.states import illegal as report
from llmobs.wire.upstream import Exchange, OnBody, Upstream, UpstreamClosed
from tests.support.protocol_server import Seen, echo, serving
from tests.support.rawhttp import WAIT, get, read_response, read_to_eof

Table = Mapping[IntEnum, Mapping[IntEnum, IntEnum]]
LEGS: dict[str, tuple[Table, type[IntEnum], type[IntEnum]]] = {
    "client": (CLIENT, ClientState, ClientEvent),  # type: ignore[dict-item]
    "writing": (WRITE, WriteState, WriteEvent),  # type: ignore[dict-item]
    "engine": (ENGINE, EngineState, EngineEvent),  # type: ignore[dict-item]
}
S = TypeVar("S", bound=IntEnum)
Ev = TypeVar("Ev", bound=IntEnum)
C, CE = ClientState, ClientEvent
E, EE = EngineState, EngineEvent


def _pairs(legal: bool) -> list[tuple[str, IntEnum, IntEnum]]:
    return [
        (leg, state, event)
        for leg, (table, states, events) in LEGS.items()
        for state in states
        for event in events
        if (event in table[state]) is legal
    ]


@pytest.mark.parametrize(("leg", "state", "event"), _pairs(legal=True))
def test_every_legal_transition_is_compiled(leg: str, state: IntEnum, event: IntEnum) -> None:
    table, states, events = LEGS[leg]
    assert compiled(table, states, events)[state][event] is table[state][event]


@pytest.mark.parametrize(("leg", "state", "event"), _pairs(legal=False))
def test_every_illegal_transition_is_refused(leg: str, state: IntEnum, event: IntEnum) -> None:
    table, states, events = LEGS[leg]
    assert compiled(table, states, events)[state][event] is None


def test_an_illegal_transition_is_reported_in_one_line(
    illegal: Callable[[str], int], caplog: pytest.LogCaptureFixture
) -> None:
    """Both legs report through ``states.illegal``: one error record naming the leg, the
    event and the state, with the error attached (what the wire's tests count)."""
    with caplog.at_level(logging.ERROR, "llmobs.wire"):
        error = report("engine", EngineState.SENT, EngineEvent.SEND)
    assert (illegal("engine"), illegal("client")) == (1, 0)
    assert (error.leg, error.state, error.event) == ("engine", EngineState.SENT, EngineEvent.SEND)
    assert str(error) == "engine connection: SEND in state SENT"
    [record] = caplog.records
    assert (record.name, record.levelno) == ("llmobs.wire", logging.ERROR)
    assert record.getMessage() == (
        "engine connection: SEND in state SENT is not a transition (a bug): closing it"
    )
    assert record.__dict__["illegal"] is error


def _terminal(table: Table, state: IntEnum) -> bool:
    return all(after is state for after in table[state].values())


@pytest.mark.parametrize("leg", sorted(LEGS))
def test_every_state_is_reached_and_every_one_can_end(leg: str) -> None:
    """From the first state every state is reached, and from every state one that nothing
    moves out of (the connection's end): a connection never stays stuck."""
    table, states, _ = LEGS[leg]
    assert set(table) == set(states)
    reached = {min(states)}
    while more := {after for state in reached for after in table[state].values()} - reached:
        reached |= more
    assert reached == set(states)
    if leg == "writing":
        return  # (a transport's writing ends with it)
    for state in states:
        ends = {state}
        while not any(_terminal(table, s) for s in ends):
            more = {after for s in ends for after in table[s].values()} - ends
            assert more, f"{state.name} cannot end"
            ends |= more


def test_the_end_is_legal_from_anywhere() -> None:
    """Closing or losing a connection may happen in any state, and more than once; a
    shutdown may come in any state of the client's, a response be written to a closing one."""
    for client_state in ClientState:
        assert CE.LOST in CLIENT[client_state] or client_state is C.CLOSED
        assert {CE.CLOSE, CE.SHUTDOWN} <= set(CLIENT[client_state])
    for state in (C.CLOSING, C.CLOSED):
        assert {CLIENT[state][e] for e in (CE.BEGIN, CE.BEGIN_LAST, CE.END)} == {state}
    for engine_state in EngineState:
        ended = engine_state in (E.CLOSED, E.UNANSWERED)
        assert EE.LOST in ENGINE[engine_state] or ended
        assert EE.RETIRE in ENGINE[engine_state]


def _walk(table: Mapping[S, Mapping[Ev, S]], start: S, events: Sequence[Ev]) -> S:
    state = start
    for event in events:
        assert event in table[state], f"{event.name} in {state.name}"
        state = table[state][event]
    return state


@pytest.mark.parametrize(
    ("events", "after"),
    [
        # the body whole: the response keeps the connection unless it says close
        ([CE.REQUEST, CE.BEGIN, CE.END, CE.DONE], C.IDLE),
        ([CE.REQUEST, CE.BEGIN_LAST, CE.END, CE.DONE], C.CLOSING),
        ([CE.REQUEST, CE.BEGIN, CE.DONE], C.CLOSING),  # cut short
        # a shutdown closes after the response, whenever it comes
        ([CE.SHUTDOWN], C.CLOSING),
        ([CE.REQUEST, CE.SHUTDOWN, CE.BEGIN, CE.END, CE.DONE], C.CLOSING),
        ([CE.REQUEST, CE.BEGIN, CE.SHUTDOWN, CE.END, CE.DONE], C.CLOSING),
        ([CE.REQUEST, CE.BEGIN, CE.END, CE.SHUTDOWN, CE.DONE], C.CLOSING),
        ([CE.HEAD, CE.SHUTDOWN, CE.BODY, CE.BEGIN, CE.END, CE.DONE], C.CLOSING),
        # the body still coming, or refused: the rest is drained after the response
        ([CE.HEAD, CE.BEGIN, CE.END, CE.DONE], C.LINGERING),
        ([CE.HEAD, CE.BAD_BODY, CE.BEGIN_LAST, CE.END, CE.DONE], C.LINGERING),
        ([CE.BAD_BODY, CE.BEGIN, CE.END, CE.DONE], C.LINGERING),
        ([CE.HEAD, CE.BEGIN, CE.BAD_BODY, CE.END, CE.DONE], C.LINGERING),
        ([CE.HEAD, CE.BEGIN, CE.DONE], C.CLOSING),  # cut short
        ([CE.LINGER], C.LINGERING),  # a head refused before any handler
        # ... unless the body came meanwhile: nothing to drain, the response said close
        ([CE.HEAD, CE.BEGIN, CE.BODY, CE.END, CE.DONE], C.CLOSING),
        ([CE.HEAD, CE.BEGIN, CE.END, CE.BODY, CE.DONE], C.CLOSING),
        ([CE.HEAD, CE.BODY, CE.BEGIN, CE.END, CE.DONE], C.IDLE),
    ],
)
def test_what_follows_a_response_is_the_state(
    events: list[ClientEvent], after: ClientState
) -> None:
    assert _walk(CLIENT, C.IDLE, events) is after


@pytest.mark.parametrize(
    ("events", "keeps"),
    [
        ([CE.REQUEST], True),
        ([CE.REQUEST, CE.SHUTDOWN], False),
        ([CE.HEAD], False),
        ([CE.HEAD, CE.BODY], True),
        ([CE.HEAD, CE.SHUTDOWN, CE.BODY], False),
        ([CE.BAD_BODY], False),
    ],
)
def test_a_response_keeps_the_connection_only_after_a_whole_body(
    events: list[ClientEvent], keeps: bool
) -> None:
    """What a response head may promise (keep-alive) is the table's answer to ``BEGIN``."""
    state = _walk(CLIENT, C.IDLE, events)
    assert state in CLIENT_UNANSWERED
    assert (CLIENT[state][CE.BEGIN] is C.SENDING) is keeps
    assert CLIENT[state][CE.BEGIN_LAST] is not C.SENDING
    assert CE.END in CLIENT[CLIENT[state][CE.BEGIN]]


def test_a_handler_cannot_return_before_its_response_begins() -> None:
    """The connection answers 500 first: ``DONE`` with no response is a bug."""
    for state in CLIENT_UNANSWERED:
        assert CE.DONE not in CLIENT[state]


def test_the_clients_writing_pauses_and_resumes_in_turn() -> None:
    flowing, paused = WriteState.FLOWING, WriteState.PAUSED
    assert _walk(WRITE, flowing, [WriteEvent.PAUSE, WriteEvent.RESUME]) is flowing
    assert WriteEvent.PAUSE not in WRITE[paused]
    assert WriteEvent.RESUME not in WRITE[flowing]


@pytest.mark.parametrize(
    ("events", "after"),
    [
        ([EE.SEND, EE.HEAD, EE.END], E.IDLE),  # kept alive: back to the pool
        ([EE.SEND, EE.HEAD_LAST, EE.END], E.SPENT),  # its head forbade reuse
        ([EE.SEND, EE.HEAD, EE.RETIRE], E.SPENT),  # bytes after it, or the request unsent
        ([EE.SEND, EE.PART, EE.PART, EE.HEAD], E.RELAYING),
        ([EE.SEND, EE.LOST], E.UNANSWERED),  # closed before a byte: may go again
        ([EE.SEND, EE.PART, EE.LOST], E.CLOSED),  # answered in part: may not
        ([EE.SEND, EE.RETIRE, EE.LOST], E.CLOSED),  # closed by us
        ([EE.LOST], E.CLOSED),  # closed in the pool
    ],
)
def test_the_engine_legs_exchange(events: list[EngineEvent], after: EngineState) -> None:
    assert _walk(ENGINE, E.IDLE, events) is after


async def test_an_illegal_client_transition_closes_that_connection_only(
    illegal: Callable[[str], int], caplog: pytest.LogCaptureFixture
) -> None:
    """A handler with a bug (a second response head): the connection that meets it is
    reported and aborted, the second head never sent; a request on another connection is
    served as ever."""

    async def twice(request: Request) -> None:
        if request.target == "/twice":
            request.begin(200, "OK", [], 2)
            request.begin(200, "OK", [], 2)
            return
        await handler(request)

    seen = Seen()
    handler = echo(seen)
    async with serving() as serve:
        served = await serve(twice)
        broken = await served.connect()
        with caplog.at_level(logging.ERROR, "llmobs.wire"):
            await broken.send(get("/twice"))
            seen_there = await asyncio.wait_for(read_to_eof(broken.reader), WAIT)
        assert seen_there.count(b"HTTP/1.1 ") <= 1  # the first head at most: then aborted
        assert illegal("client") == 1
        assert "client connection: BEGIN in state SENDING is not a transition" in caplog.text
        other = await served.connect()
        await other.send(get("/fine"))
        response = await read_response(other.reader)
        assert (response.status, seen.targets) == (200, ["/fine"])


async def test_an_illegal_engine_transition_fails_that_exchange_only(
    illegal: Callable[[str], int], caplog: pytest.LogCaptureFixture
) -> None:
    """A second request sent on a connection whose exchange is on (the caller's bug) is
    refused as a closed connection; the exchange under way fails with the bug, the
    connection is aborted, and the pool's other connections carry on."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        writer.close()

    engine = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = engine.sockets[0].getsockname()[1]
    upstream = Upstream(f"http://127.0.0.1:{port}", 1.0, 4.0)
    bodies: list[bytes] = []

    def on_head(conn: Exchange, head: ResponseHead) -> OnBody:
        return lambda payload, frame, last: bodies.append(payload)

    try:
        head = upstream.request_head("GET", "/", [], None)
        first, _ = await upstream.acquire()
        first.send("GET", head, b"", on_head)
        with caplog.at_level(logging.ERROR, "llmobs.wire"), pytest.raises(UpstreamClosed):
            first.send("GET", head, b"", on_head)
        with pytest.raises(IllegalTransition):
            await asyncio.wait_for(first.wait(WAIT), WAIT)
        assert illegal("engine") == 1
        assert "engine connection: SEND in state SENT is not a transition" in caplog.text
        assert first.state in (EngineState.SPENT, EngineState.CLOSED)
        upstream.discard(first)
        second, reused = await upstream.acquire()
        assert (second is not first, reused) == (True, False)
        second.send("GET", head, b"", on_head)
        await asyncio.wait_for(second.wait(WAIT), WAIT)
        assert (bodies, second.state) == ([b"ok"], EngineState.IDLE)
        upstream.release(second)
    finally:
        upstream.close()
        engine.close()
        await asyncio.sleep(0.05)
