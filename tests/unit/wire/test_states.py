"""The legs' transition tables (``wire/states.py``): every legal transition, every illegal one
refused; and an illegal transition in a live connection caught: logged as an error, that
connection closed, the others served."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from enum import IntEnum

import pytest

from llmobs.wire import server
from llmobs.wire.http1 import ResponseHead
from llmobs.wire.states import (
    CLIENT,
    CLIENT_BUSY,
    ENGINE,
    ClientEvent,
    ClientState,
    EngineEvent,
    EngineState,
    IllegalTransition,
    compiled,
    next_state,
)
from llmobs.wire.upstream import Connection, OnBody, Upstream, UpstreamClosed
from tests.support.protocol_server import Seen, echo, serving
from tests.support.rawhttp import WAIT, closed, get, post, read_response

Table = Mapping[IntEnum, Mapping[IntEnum, IntEnum]]
LEGS: dict[str, tuple[Table, type[IntEnum], type[IntEnum]]] = {
    "client": (CLIENT, ClientState, ClientEvent),  # type: ignore[dict-item]
    "engine": (ENGINE, EngineState, EngineEvent),  # type: ignore[dict-item]
}


def _pairs(legal: bool) -> list[tuple[str, IntEnum, IntEnum]]:
    return [
        (leg, state, event)
        for leg, (table, states, events) in LEGS.items()
        for state in states
        for event in events
        if (event in table[state]) is legal
    ]


@pytest.mark.parametrize(("leg", "state", "event"), _pairs(legal=True))
def test_every_legal_transition(leg: str, state: IntEnum, event: IntEnum) -> None:
    table, states, events = LEGS[leg]
    after = next_state(leg, table, state, event)
    assert after is table[state][event]
    assert compiled(table, states, events)[state][event] is after


@pytest.mark.parametrize(("leg", "state", "event"), _pairs(legal=False))
def test_every_illegal_transition_is_refused(leg: str, state: IntEnum, event: IntEnum) -> None:
    table, states, events = LEGS[leg]
    with pytest.raises(IllegalTransition) as refused:
        next_state(leg, table, state, event)
    assert (refused.value.leg, refused.value.state, refused.value.event) == (leg, state, event)
    assert str(refused.value) == f"{leg} connection: {event.name} in state {state.name}"
    assert compiled(table, states, events)[state][event] is None


@pytest.mark.parametrize("leg", sorted(LEGS))
def test_every_state_is_reached_and_every_one_can_end(leg: str) -> None:
    """From the first state every state is reached, and from every state the last: a
    connection never stays stuck in one."""
    table, states, _ = LEGS[leg]
    first, last = min(states), max(states)
    assert set(table) == set(states)
    reached = {first}
    while True:
        more = {after for state in reached for after in table[state].values()} - reached
        if not more:
            break
        reached |= more
    assert reached == set(states)
    for state in states:
        ends = {state}
        while last not in ends:
            more = {after for s in ends for after in table[s].values()} - ends
            assert more, f"{state.name} cannot end"
            ends |= more


def test_the_end_is_legal_from_anywhere() -> None:
    """Closing or losing a connection may happen in any state, and more than once."""
    for client_state in ClientState:
        assert ClientEvent.LOST in CLIENT[client_state] or client_state is ClientState.CLOSED
        assert ClientEvent.CLOSE in CLIENT[client_state]
    for engine_state in EngineState:
        assert EngineEvent.LOST in ENGINE[engine_state] or engine_state is EngineState.CLOSED
        assert EngineEvent.RETIRE in ENGINE[engine_state]
    assert {ClientState.RECEIVING, ClientState.HANDLING, ClientState.REFUSED} == CLIENT_BUSY


async def test_an_illegal_client_transition_closes_that_connection_only(
    monkeypatch: pytest.MonkeyPatch, illegal: Callable[[str], int], caplog: pytest.LogCaptureFixture
) -> None:
    """A table with a bug (a head whose body is still to come has nowhere to go): the
    connection that meets it is logged and closed, its handler never run; a whole
    request on another connection is served as ever."""
    rows = [list(row) for row in server._NEXT]
    rows[ClientState.IDLE][ClientEvent.HEAD] = None
    monkeypatch.setattr(server, "_NEXT", tuple(tuple(row) for row in rows))
    seen = Seen()
    async with serving() as serve:
        served = await serve(echo(seen))
        broken = await served.connect()
        with caplog.at_level(logging.ERROR, "llmobs.server"):
            await broken.send(post("/upload", b"x" * 10)[:-5])  # the body's end still to come
            assert await asyncio.wait_for(closed(broken.reader), WAIT)
        assert illegal("client") == 1
        assert "HEAD in state IDLE is not a transition" in caplog.text
        assert seen.targets == []
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

    def on_head(conn: Connection, head: ResponseHead) -> OnBody:
        return lambda payload, frame, last: bodies.append(payload)

    try:
        head = upstream.request_head("GET", "/", [], None)
        first, _ = await upstream.acquire()
        first.send("GET", head, b"", on_head)
        with caplog.at_level(logging.ERROR, "llmobs.upstream"), pytest.raises(UpstreamClosed):
            first.send("GET", head, b"", on_head)
        with pytest.raises(IllegalTransition):
            await asyncio.wait_for(first.wait(WAIT), WAIT)
        assert illegal("engine") == 1
        assert "engine connection: SEND in state SENT" in caplog.text
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
