"""The engine leg over HTTP/2 (``--upstream-http2``): requests as streams on a few connections
to an engine that serves h2c (prior knowledge) or h2 (ALPN over TLS).

Each exchange (``H2Exchange``) is what the relay uses of an HTTP/1.1 ``connection.Connection``:
``send`` (the head as the HTTP/1.1 writer made it, read back into a header block), ``wait``
(with the read timeout between reads), ``pause_reading``/``resume_reading`` and ``close``
(RST_STREAM CANCEL). Its response head is an ``http1.ResponseHead`` and its body goes to the
same callback, so nothing above the wire tells the two engine legs apart. Flow control: a
stream's received bytes are credited back as they are relayed, except while its client is
slow (paused): then the engine's window for that stream closes and its tokens wait in the
engine, while the other streams flow (the connection's window is large: ``CONNECTION_WINDOW``).
A request body larger than the engine's window waits for it. ``H2Upstream`` keeps the
connections: a stream goes on the first with room under the engine's
``SETTINGS_MAX_CONCURRENT_STREAMS``, else a new connection is opened.

The ``h2`` package keeps the protocol's state; this module is the relay's side of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from multidict import CIMultiDict

from llmobs.wire.connection import OnBody, OnHead, Tail, UpstreamClosed, UpstreamTimeout
from llmobs.wire.h2.machine import draining
from llmobs.wire.http1 import ResponseHead, parse_request_head

log = logging.getLogger("llmobs.upstream")

STREAM_WINDOW = 1 << 20  # what the engine may send ahead on a stream (SETTINGS_INITIAL_WINDOW)
CONNECTION_WINDOW = 64 << 20  # ... and on a connection: 64 paused streams before it stalls
MAX_UNSENT = 16 << 20  # a streamed request body's bytes the engine's window may hold back
_NOT_SENT = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "upgrade",
                       "proxy-connection", "te"})  # fmt: skip


class H2Exchange:
    """One request on an engine connection, as the relay sees an HTTP/1.1 exchange."""

    __slots__ = (
        "_conn", "_done", "_last", "_on_body", "_on_head", "_owed", "_paused", "_timer",
        "answered", "body_open", "ended", "head_ended", "sent_end", "stream_id", "trailers",
        "transport", "unsent",
    )  # fmt: skip

    def __init__(self, conn: H2EngineConnection) -> None:
        self._conn = conn
        self.transport = conn.transport
        self.stream_id = 0
        self._on_head: OnHead | None = None
        self._on_body: OnBody | None = None
        self._done: asyncio.Future[None] = conn.loop.create_future()
        self.unsent = bytearray()  # what the engine's window has not admitted yet
        self._paused = False
        self._owed = 0  # bytes received while paused, credited back on resume
        self._last = conn.loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self.answered = False  # its response head came
        self.ended = False
        self.head_ended = False  # the head ended the stream: a gRPC "trailers-only" answer
        self.trailers: list[tuple[str, str]] | None = None  # the engine's, when it sent some
        self.body_open = False  # the request body still comes (``more``): a gRPC stream
        self.sent_end = False  # the request's END_STREAM went

    @property
    def relaying(self) -> bool:
        """Its response is being relayed (head come, not ended)."""
        return self.answered and not self.ended

    @property
    def unanswered(self) -> bool:
        """The engine ended it before any of its response: refused, never processed."""
        return not self.answered

    def send(
        self, method: str, head: bytes, body: bytes, on_head: OnHead, tail: Tail | None = None
    ) -> None:
        """Send the request: ``head`` as the HTTP/1.1 writer made it, then ``body``; with a
        ``tail``, the rest of the body follows as the client sends it (``more``), while the
        response streams back (full duplex: a gRPC client or bidirectional stream)."""
        self._on_head = on_head
        self.body_open = tail is not None
        self._conn.open(self, _block(head, self._conn.authority, self._conn.scheme), body)
        if tail is not None:
            tail.follow(self.more)

    def more(self, data: bytes, end: bool) -> None:
        """More of the request body (``end``: its last): sent as the engine's window admits.
        What the window holds back is bounded (``MAX_UNSENT``): a client that sends faster
        than the engine reads, past it, has its call ended (the client's leg credits what it
        receives at once, so the bound is here)."""
        if self.ended or not self.body_open:
            return
        self.body_open = not end
        self.unsent += data
        if len(self.unsent) > MAX_UNSENT:
            self.close(UpstreamClosed("the client sent more than the engine read"))
            return
        self._conn.send_more(self)

    async def wait(self, read_timeout: float) -> None:
        """Until the response ends; ``UpstreamTimeout`` after ``read_timeout`` seconds with
        nothing read (not counting while paused)."""
        self._timer = self._conn.loop.call_later(read_timeout, self._check, read_timeout)
        try:
            await self._done
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._on_body = None

    def _check(self, read_timeout: float) -> None:
        loop = self._conn.loop
        quiet = loop.time() - self._last
        if self._paused or quiet < read_timeout:
            wait = read_timeout if self._paused else read_timeout - quiet
            self._timer = loop.call_later(wait, self._check, read_timeout)
            return
        self._timer = None
        self.close(UpstreamTimeout("upstream read timed out"))

    # -- told by the connection -------------------------------------------------------------
    def headed(self, head: ResponseHead) -> None:
        self._last = self._conn.loop.time()
        on_head, self._on_head = self._on_head, None
        if on_head is None:
            return
        self.answered = True
        try:
            self._on_body = on_head(self, head)
        except Exception as exc:
            self.close(exc)

    def data(self, data: bytes, credit: int) -> None:
        self._last = self._conn.loop.time()
        if self._paused:
            self._owed += credit
        else:
            self._conn.credit(self.stream_id, credit)
        on_body = self._on_body
        if on_body is not None and data:
            on_body(data, None, False)

    def finished(self) -> None:
        self.ended = True
        self.body_open = False
        on_body, self._on_body = self._on_body, None
        if on_body is not None:
            on_body(b"", None, True)
        if not self._done.done():
            self._done.set_result(None)

    def fail(self, exc: BaseException) -> None:
        self.ended = True
        self._on_body = self._on_head = None
        if not self._done.done():
            self._done.set_exception(exc)
            self._done.exception()  # retrieved: a failure no one awaits is not logged

    # -- the relay's controls -----------------------------------------------------------------
    def pause_reading(self) -> None:
        """The client is slow: the engine's window for this stream is not reopened."""
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        self._last = self._conn.loop.time()
        owed, self._owed = self._owed, 0
        if owed and not self.ended:
            self._conn.credit(self.stream_id, owed)

    def close(self, reason: Exception | None = None) -> None:
        """End it now: RST_STREAM CANCEL if it has not ended (the engine stops generating);
        a wait still under way ends with ``reason`` (by default ``UpstreamClosed``: a
        shutdown's grace, a client gone)."""
        if not self.ended:
            self.ended = True
            self._conn.cancel(self.stream_id)
        self._on_body = None
        if not self._done.done():
            self._done.set_exception(reason or UpstreamClosed("the exchange was closed"))
            self._done.exception()  # retrieved: a wait that is over need not log it


class H2EngineConnection(asyncio.Protocol):
    """One HTTP/2 connection to the engine, carrying many exchanges."""

    def __init__(self, loop: asyncio.AbstractEventLoop, authority: str, scheme: str) -> None:
        self.loop = loop
        self.authority = authority
        self.scheme = scheme
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self._h2 = draining(h2.connection.H2Connection(config=config))
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self._exchanges: dict[int, H2Exchange] = {}
        self._bodies: dict[int, H2Exchange] = {}  # those with body bytes the window holds back
        self.usable = True  # no GOAWAY came, not closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        tls = transport.get_extra_info("ssl_object")
        chosen = tls.selected_alpn_protocol() if tls is not None else "h2"
        if chosen != "h2":  # an https engine that would not speak HTTP/2: nothing to send it
            log.warning(
                "the engine did not agree to HTTP/2 by ALPN (it chose %s): each request is a "
                "502; drop --upstream-http2 for this engine (gRPC needs HTTP/2: its calls fail)",
                chosen or "nothing",
            )  # fmt: skip
            self.usable = False
            transport.close()
            return
        h2conn = self._h2
        h2conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        h2conn.initiate_connection()
        h2conn.increment_flow_control_window(CONNECTION_WINDOW)
        self._flush()

    @property
    def room(self) -> bool:
        """Whether another stream may open now (under the engine's limit)."""
        limit = self._h2.remote_settings.max_concurrent_streams
        return self.usable and self._h2.open_outbound_streams < limit

    def open(self, exchange: H2Exchange, block: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Start ``exchange``'s stream: its header block, then its body as the window allows."""
        if not self.usable or self.transport.is_closing():
            raise UpstreamClosed("upstream closed the connection")
        stream_id = self._h2.get_next_available_stream_id()
        exchange.stream_id = stream_id
        self._exchanges[stream_id] = exchange
        exchange.sent_end = not body and not exchange.body_open
        self._h2.send_headers(stream_id, block, end_stream=exchange.sent_end)
        if body:
            exchange.unsent = bytearray(body)  # the connection's to send
            self._send_body(exchange)
        self._flush()

    def send_more(self, exchange: H2Exchange) -> None:
        """More of an open request body came (``H2Exchange.more``): send what the window
        admits, and the stream's end once it is all sent, if it was the last."""
        if exchange.stream_id in self._exchanges:
            self._send_body(exchange)
            self._flush()

    def _send_body(self, exchange: H2Exchange) -> None:
        """As much of ``exchange``'s body as the windows admit; the rest when they open. The
        stream ends with the body's last byte, unless more of it is still to come."""
        body, stream_id, h2conn = exchange.unsent, exchange.stream_id, self._h2
        last = not exchange.body_open
        try:
            while body:
                window = h2conn.local_flow_control_window(stream_id)
                room = min(window, h2conn.max_outbound_frame_size)
                if room <= 0:
                    break
                end = last and len(body) <= room
                h2conn.send_data(stream_id, bytes(body[:room]), end_stream=end)
                exchange.sent_end = end
                del body[:room]  # (from the front of a bytearray: no copy of the rest)
            if last and not body and not exchange.sent_end:  # the last of it came empty
                h2conn.end_stream(stream_id)
                exchange.sent_end = True
        except h2.exceptions.StreamClosedError:
            body.clear()  # the engine ended the stream: what it did not read is not wanted
        except h2.exceptions.ProtocolError as exc:  # the connection's state refuses it
            body.clear()
            self._exchanges.pop(stream_id, None)
            exchange.fail(UpstreamClosed(f"upstream HTTP/2 refused the body ({exc})"))
        if body:
            self._bodies[stream_id] = exchange
        else:
            self._bodies.pop(stream_id, None)

    def credit(self, stream_id: int, n: int) -> None:
        """``n`` bytes of the stream were relayed: the engine may send them again."""
        if n and stream_id in self._exchanges:
            self._h2.acknowledge_received_data(n, stream_id)
            self._flush()

    def cancel(self, stream_id: int) -> None:
        self._exchanges.pop(stream_id, None)
        self._bodies.pop(stream_id, None)
        try:
            self._h2.reset_stream(stream_id, ErrorCodes.CANCEL)
        except h2.exceptions.H2Error:
            return  # ended already on the engine's side
        self._flush()

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)

    # -- asyncio.Protocol -------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if not self.usable and self.transport.is_closing():
            return  # closed on our side (GOAWAY sent): what still comes is no one's
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.H2Error as exc:
            log.warning("the engine's HTTP/2 broke the protocol (%s: %s): closing",
                        type(exc).__name__, exc)  # fmt: skip
            self._flush()
            self._lose(UpstreamClosed("upstream HTTP/2 protocol error"))
            self.transport.close()
            return
        for event in events:
            self._event(event)
        self._flush()

    def _event(self, event: Any) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _response(self, event: h2.events.ResponseReceived) -> None:
        exchange = self._exchanges.get(event.stream_id)
        if exchange is not None:
            exchange.head_ended = event.stream_ended is not None
            exchange.headed(_response_head(event.headers or []))

    def _trailers(self, event: h2.events.TrailersReceived) -> None:
        """The engine's trailers (gRPC's status): kept for the client's, as they came."""
        exchange = self._exchanges.get(event.stream_id)
        if exchange is not None:
            exchange.trailers = _fields(event.headers or [])

    def _data(self, event: h2.events.DataReceived) -> None:
        exchange = self._exchanges.get(event.stream_id)
        credit = event.flow_controlled_length or 0
        if exchange is None:
            self._h2.acknowledge_received_data(credit, event.stream_id)  # a cancelled stream's
            return
        exchange.data(event.data or b"", credit)

    def _ended(self, event: h2.events.StreamEnded) -> None:
        exchange = self._exchanges.pop(event.stream_id, None)
        if exchange is not None:
            if not exchange.sent_end:  # answered whole before the request's end (gRPC): the
                self._bodies.pop(event.stream_id, None)  # rest of the body is not wanted
                with contextlib.suppress(h2.exceptions.H2Error):
                    self._h2.reset_stream(event.stream_id, ErrorCodes.NO_ERROR)
            exchange.finished()

    def _reset(self, event: h2.events.StreamReset) -> None:
        exchange = self._exchanges.pop(event.stream_id, None)
        self._bodies.pop(event.stream_id, None)
        if exchange is not None:
            exchange.fail(UpstreamClosed(f"upstream reset the stream ({event.error_code!r})"))

    def _window(self, event: h2.events.WindowUpdated) -> None:
        for exchange in list(self._bodies.values()):
            self._send_body(exchange)

    def _goaway(self, event: h2.events.ConnectionTerminated) -> None:
        """GOAWAY: the streams above its last one were never processed (safe to send again);
        no new ones go on this connection."""
        self.usable = False
        last = event.last_stream_id if event.last_stream_id is not None else 0
        for stream_id in [s for s in self._exchanges if s > last]:
            self._exchanges.pop(stream_id).fail(UpstreamClosed("upstream went away (GOAWAY)"))

    def eof_received(self) -> bool:
        self._lose(UpstreamClosed("upstream closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(UpstreamClosed("upstream closed the connection"))

    def _lose(self, exc: Exception) -> None:
        self.usable = False
        exchanges, self._exchanges = self._exchanges, {}
        self._bodies.clear()
        for exchange in exchanges.values():
            exchange.fail(exc)

    def close(self) -> None:
        self.usable = False
        if not self.transport.is_closing():
            self._h2.close_connection()
            self._flush()
            self.transport.close()


_HANDLERS: dict[type, Callable[[H2EngineConnection, Any], None]] = {
    h2.events.ResponseReceived: H2EngineConnection._response,
    h2.events.DataReceived: H2EngineConnection._data,
    h2.events.TrailersReceived: H2EngineConnection._trailers,
    h2.events.StreamEnded: H2EngineConnection._ended,
    h2.events.StreamReset: H2EngineConnection._reset,
    h2.events.WindowUpdated: H2EngineConnection._window,
    h2.events.ConnectionTerminated: H2EngineConnection._goaway,
}


class H2Upstream:
    """The engine over HTTP/2: its connections, and an exchange for each request (the
    ``upstream.Upstream`` interface the relay uses)."""

    def __init__(
        self,
        host: str,
        port: int,
        authority: str,
        connect_timeout: float,
        tls: Callable[[], ssl.SSLContext] | None = None,
        server_name: str = "",
    ) -> None:
        self.host, self.port, self.authority = host, port, authority
        self._connect_timeout = connect_timeout
        self._tls = tls
        self._server_name = server_name or host
        self._conns: list[H2EngineConnection] = []
        self._opening: asyncio.Task[H2EngineConnection] | None = None

    async def acquire(self) -> tuple[H2Exchange, bool]:
        """An exchange on a connection with room; a new connection if none has."""
        for conn in self._conns:
            if conn.room and not conn.transport.is_closing():
                return H2Exchange(conn), True
        self._conns = [c for c in self._conns if c.usable and not c.transport.is_closing()]
        conn = await self._connect()
        return H2Exchange(conn), False

    async def _connect(self) -> H2EngineConnection:
        """A new connection (one at a time: requests arriving meanwhile share it)."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        opening = self._opening
        try:
            return await asyncio.shield(opening)
        finally:
            if opening.done():
                self._opening = None

    async def _open(self) -> H2EngineConnection:
        loop = asyncio.get_running_loop()
        tls = self._tls() if self._tls is not None else None
        scheme = "https" if tls is not None else "http"
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: H2EngineConnection(loop, self.authority, scheme), self.host,
                    self.port, ssl=tls, server_hostname=self._server_name if tls else None,
                )  # fmt: skip
        except TimeoutError:
            raise UpstreamTimeout("upstream connect timed out") from None
        self._conns.append(conn)
        return conn

    def release(self, exchange: H2Exchange) -> None:
        """The exchange ended (its stream is closed, or is reset now if not)."""
        exchange.close()

    def discard(self, exchange: H2Exchange) -> None:
        exchange.close()

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns.clear()


def _block(head: bytes, authority: str, scheme: str) -> list[tuple[bytes, bytes]]:
    """An HTTP/1.1 request head as HTTP/2's header block: the pseudo-headers, then the fields
    HTTP/2 allows (no connection-specific ones; names in lower case)."""
    parsed = parse_request_head(head[: head.index(b"\r\n\r\n")] if b"\r\n\r\n" in head else head)
    block = [
        (b":method", parsed.method.encode("ascii")), (b":scheme", scheme.encode("ascii")),
        (b":authority", authority.encode("latin-1")), (b":path", parsed.target.encode("latin-1")),
    ]  # fmt: skip
    for name, value in parsed.fields:
        lower = name.lower()
        if lower not in _NOT_SENT or (lower == "te" and value.strip().lower() == "trailers"):
            block.append((lower.encode("ascii"), value.encode("latin-1")))
    return block


def _fields(block: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """A header block's fields, in order, without its pseudo-headers."""
    return [(n.decode("ascii"), v.decode("latin-1")) for n, v in block if n[:1] != b":"]


def _response_head(block: list[tuple[bytes, bytes]]) -> ResponseHead:
    """The engine's header block as an HTTP/1.1 response head (its fields in order)."""
    status = 0
    for name, value in block:
        if name == b":status":
            status = int(value)
    fields = _fields(block)
    try:
        reason = HTTPStatus(status).phrase  # what the client's HTTP/1.1 status line says
    except ValueError:
        reason = "Unknown"
    return ResponseHead((2, 0), status, reason, CIMultiDict(fields), fields)
