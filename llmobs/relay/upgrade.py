"""A WebSocket through the relay: the upgrade request forwarded with its handshake intact and,
once the engine answers 101, a tunnel (``wire.tunnel``) between the two connections, observed
message by message (``observe.realtime``) into one session record.

The request goes through the relay as any GET does (``proxy._Exchange``), with its
``Upgrade`` and ``Connection`` headers kept (hop-by-hop, they are otherwise dropped). An
answer other than 101 (a 404, a 401) is an ordinary response, relayed and recorded as a
request; a 101 is written to the client as the engine sent it, and the session begins. Only
HTTP/1.1's upgrade is carried: HTTP/2's extended CONNECT (RFC 8441) is not offered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from llmobs.observe.realtime import (
    KEEP,
    Session,
    SessionOutcome,
    SessionRecord,
    Turn,
    api_of,
    closed_outcome,
)
from llmobs.relay.observing import NULL_OBSERVER, RequestObserver
from llmobs.relay.response import ResponseRelay
from llmobs.wire.http1 import ResponseHead
from llmobs.wire.server import Request
from llmobs.wire.tunnel import Ending, Tunnel
from llmobs.wire.upstream import Connection, Exchange, OnBody
from llmobs.wire.websocket import FrameReader, Message, deflated

log = logging.getLogger("llmobs.websocket")

# how a tunnel's end reads as a session's outcome, when no close frame decides it
_OUTCOMES = {
    Ending.IDLE: SessionOutcome.IDLE_TIMEOUT,
    Ending.TOO_LARGE: SessionOutcome.TOO_LARGE,
    Ending.CLIENT_STALLED: SessionOutcome.CLIENT_TIMEOUT,
    Ending.CLOSED: SessionOutcome.SHUTDOWN,
}
# what a trace context is read from: never another header
_TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


def is_websocket(request: Request) -> bool:
    """An HTTP/1.1 GET asking to upgrade to a WebSocket (RFC 6455 4.1)."""
    headers = request.headers
    if "websocket" not in headers.get("Upgrade", "").lower():
        return False
    tokens = headers.get("Connection", "").lower().split(",")
    return any(token.strip() == "upgrade" for token in tokens)


def upgrade_headers(request: Request) -> list[tuple[str, str]]:
    """The hop-by-hop headers a WebSocket's handshake needs, as the engine expects them."""
    return [("Connection", "Upgrade"), ("Upgrade", request.headers.get("Upgrade", "websocket"))]


class Handshake(ResponseRelay):
    """The upgrade's response: a 101 is kept for the session (``head``), anything else is
    relayed as any response is, observed from its head on (``on_refused``)."""

    __slots__ = ("_on_refused", "head")

    def __init__(
        self,
        request: Request,
        relayed: set[Exchange],
        on_refused: Callable[[], RequestObserver],
    ) -> None:
        super().__init__(request, NULL_OBSERVER, None, relayed)
        self._on_refused = on_refused
        self.head: ResponseHead | None = None

    def on_head(self, conn: Exchange, head: ResponseHead) -> OnBody:
        if head.status != 101:
            self.observe(self._on_refused())
            return super().on_head(conn, head)
        self.conn = conn
        if self._request.closed:
            self.gone = True
            raise ConnectionResetError("the client went away before the 101")
        self.head = head
        return _nothing


def _nothing(data: bytes, frame: bytes | None, last: bool) -> None:
    """A 101 has no body."""


@dataclass(frozen=True)
class Limits:
    """A session's limits: the largest message, seconds idle, seconds a client may take
    none of what it was sent."""

    max_message: int
    idle_timeout: float
    client_timeout: float


class SessionSink(Protocol):
    """Where sessions are told (``export.realtime.SessionExport``): a session opened, messages
    relayed, a turn ended, the session ended (with the upgrade's trace context and the wall
    clock at its start)."""

    def opened(self, api: str) -> None: ...
    def relayed(self, api: str, side: int, count: int) -> None: ...
    def turn(self, model: str | None, turn: Turn) -> None: ...
    def finished(self, record: SessionRecord, headers: Mapping[str, str], wall0: int) -> None: ...


class WebSocketSession:
    """One session: the tunnel, its observation, its record."""

    def __init__(
        self, request: Request, head: ResponseHead, conn: Connection, sink: SessionSink | None
    ) -> None:
        self.request = request
        self.head = head
        self.conn = conn
        self.sink = sink
        self.start_ns = perf_counter_ns()
        self.wall = time.time_ns()
        query = parse_qs(urlsplit(request.target).query)
        model = query.get("model", [""])[0] or None
        self.session = Session(api_of(request.path), self.start_ns, model)

    async def run(self, limits: Limits) -> None:
        """Write the 101 and relay both ways until either side ends it."""
        head, request, conn = self.head, self.request, self.conn
        keep = KEEP if self.sink is not None else 0
        deflate = deflated(head.headers.get("Sec-WebSocket-Extensions", ""))
        readers = (
            FrameReader(limits.max_message, keep, deflate),
            FrameReader(limits.max_message, keep, deflate),
        )
        lines = [f"HTTP/1.1 101 {head.reason}", *(f"{k}: {v}" for k, v in head.fields), "\r\n"]
        client, rest = request.switch("\r\n".join(lines).encode("latin-1"))
        engine = conn.transport
        assert engine is not None
        tunnel = Tunnel(
            asyncio.get_running_loop(), (client, engine), readers, idle_timeout=limits.idle_timeout,
            client_timeout=limits.client_timeout,
            on_messages=self._messages if self.sink is not None else None,
        )  # fmt: skip
        if self.sink is not None:
            self.sink.opened(self.session.api)
        tunnel.start(rest, conn.switched)
        try:
            ending = await tunnel.ended
        except BaseException:
            tunnel.close()
            self._finish(Ending.CLOSED)
            raise
        self._finish(ending)

    def _messages(self, side: int, messages: list[Message]) -> None:
        """Messages that ended in one read from ``side``: observed with the read's time."""
        t_ns = perf_counter_ns()
        session, sink = self.session, self.sink
        assert sink is not None
        for message in messages:
            turn = session.message(side, t_ns, message.opcode, message.payload)
            if turn is not None:
                sink.turn(session.model, turn)
        sink.relayed(session.api, side, len(messages))

    def _finish(self, ending: Ending) -> None:
        sink = self.sink
        if sink is None:
            return
        outcome = _OUTCOMES.get(ending)
        if outcome is None:
            outcome = closed_outcome(ending is Ending.ENGINE_CLOSED, self.session.close)
        record, cut = self.session.finish(perf_counter_ns(), outcome)
        try:
            if cut is not None:
                sink.turn(record.model, cut)
            headers = {k: v for k in _TRACE_HEADERS if (v := self.request.headers.get(k))}
            sink.finished(record, headers, self.wall)
        except Exception:
            log.exception("recording a WebSocket session failed")
