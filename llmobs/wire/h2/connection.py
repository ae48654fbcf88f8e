"""An HTTP/2 client connection: the ``h2`` state machine fed with what the client sends, each
stream a request whose handler runs in a task of its own, as a request over HTTP/1.1 does.

What it does beside the protocol (which is ``h2``'s), as a reverse proxy's HTTP/2 side should:
- streams: at most ``MAX_STREAMS`` open at once (advertised; more is the client's protocol
  error, the connection's end), each body buffered up to the limit and read whole;
- flow control both ways: a request body's bytes are credited back as they arrive (the body
  is bounded by ``max_body``, not by the window); a response's bytes the client's windows do
  not admit wait in the stream's backlog, which past ``HIGH_WATER`` pauses that stream's
  engine (``H2Stream.tell_paused``), and a backlog that does not move for ``client_timeout``
  has its stream reset (a window never opened holds neither an engine slot nor the memory);
  a client that stops reading the connection
  pauses every stream and is not read from until it does (its PINGs and SETTINGS cannot make
  us buffer), and is cut off after ``client_timeout`` as over HTTP/1.1;
- floods: streams reset by the client (rapid reset, CVE-2023-44487) and control frames
  (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, empty DATA) are counted in ``FLOOD_WINDOW``
  seconds, each DATA frame sent allowing two WINDOW_UPDATEs more (a client crediting what it
  reads is no flood); past their budget the connection gets GOAWAY ENHANCE_YOUR_CALM. A
  header block is bounded by ``h2`` (CONTINUATION frames, CVE-2024-27316) and by our
  ``MAX_HEADER_LIST_SIZE`` (an HPACK bomb decodes to no more);
- idle: no stream for ``client_timeout`` and the connection is closed (GOAWAY first);
- shutdown: new streams refused (REFUSED_STREAM), then GOAWAY and closed once the streams in
  flight have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes

from llmobs.config.logs import method_label
from llmobs.wire.h2.heads import request_head
from llmobs.wire.h2.machine import draining
from llmobs.wire.h2.stream import H2Stream
from llmobs.wire.http1 import MAX_REQUEST_HEAD_BYTES, BadRequest
from llmobs.wire.request import openai_error_body

log = logging.getLogger("llmobs.server")


class Server(Protocol):
    """What a connection needs of its server (``server.ProxyServer``)."""

    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    closing: bool
    client_timeout: float
    max_body: int
    handler: Callable[[Any], Awaitable[None]]
    on_reject: Callable[[int, float], None] | None


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # what a client with prior knowledge sends first

MAX_STREAMS = 128  # open streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS)
WINDOW = 1 << 20  # what a client may send ahead on a stream, and on the connection
HIGH_WATER = 64 * 1024  # a stream's unsent backlog above which its engine is paused
LOW_WATER = 16 * 1024  # ... and below which it is resumed (a connection holds at most
# MAX_STREAMS x HIGH_WATER and a read's worth more: 8 MiB)
FLOOD_WINDOW = 10.0  # seconds over which resets and control frames are counted
MAX_RESETS = 2 * MAX_STREAMS  # streams a client may reset in FLOOD_WINDOW
MAX_CONTROL = 1000  # control frames a client may send in FLOOD_WINDOW
# connection-specific fields that HTTP/2 forbids (RFC 9113 8.2.2): never sent to the client
_CONNECTION_FIELDS = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
_CONTROL = (
    h2.events.PingReceived, h2.events.RemoteSettingsChanged, h2.events.PriorityUpdated,
    h2.events.WindowUpdated, h2.events.UnknownFrameReceived,
)  # fmt: skip


class H2ServerConnection(asyncio.Protocol):
    """One client connection speaking HTTP/2: with prior knowledge (``preface``: what the
    HTTP/1.1 reader took of it) or chosen by ALPN."""

    def __init__(self, server: Server, preface: bytes = b"") -> None:
        self._server = server
        self._loop = server.loop
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self._h2 = draining(h2.connection.H2Connection(config=config))
        self._preface = preface
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.remote = ""
        self.scheme = "http"
        self._streams: dict[int, H2Stream] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._backlog: dict[int, list[bytes]] = {}  # a stream's bytes the windows hold back
        # streams to end once their backlog is sent, with the trailers to end them (or None)
        self._ending: dict[int, list[tuple[bytes, bytes]] | None] = {}
        self._held: set[int] = set()  # streams whose engine is paused (backlog past the mark)
        self._stuck: dict[int, asyncio.TimerHandle] = {}  # a backlog's reset, if it stays
        self._writing_paused = False
        self._stalled: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._floods = [0, 0]  # resets, control frames, in the current FLOOD_WINDOW
        self._window_began = 0.0
        self.closing = False
        self._draining = False

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if transport.get_extra_info("ssl_object") is not None:
            self.scheme = "https"
        self._server.connections.add(self)
        self._window_began = self._loop.time()
        h2conn = self._h2
        h2conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_REQUEST_HEAD_BYTES,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        h2conn.initiate_connection()
        h2conn.increment_flow_control_window(WINDOW)  # the connection's, beyond 65535
        self._flush()
        self._arm_idle()
        if self._server.closing:
            self.close_when_done()
        if self._preface:
            preface, self._preface = self._preface, b""
            self.data_received(preface)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # the client broke the protocol: GOAWAY
            log.debug("HTTP/2 protocol error from a client: %s", type(exc).__name__)
            self._flush()
            self.close()
            return
        for event in events:
            handle = self._HANDLERS.get(type(event))
            if handle is not None:
                handle(self, event)
            if isinstance(event, _CONTROL):
                self._count(1, MAX_CONTROL)
        self._flush()

    def eof_received(self) -> bool:
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._server.connections.discard(self)
        for timer in (self._idle, self._stalled, *self._stuck.values()):
            if timer is not None:
                timer.cancel()
        self._stuck.clear()
        for stream in list(self._streams.values()):
            stream.tell_gone()  # before the cancellation, which lands a round later
        for task in self._tasks.values():
            task.cancel()

    def pause_writing(self) -> None:
        """The client does not read: every stream pauses, nothing more is read from it (its
        control frames would make more to send), and ``client_timeout`` later it is cut off."""
        self._writing_paused = True
        self.transport.pause_reading()
        for stream in self._streams.values():
            stream.tell_paused()
        self._stalled = self._loop.call_later(self._server.client_timeout, self._cut_off)

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if not self.closing:
            self.transport.resume_reading()
        for stream in self._streams.values():
            if not self.held(stream):
                stream.tell_resumed()

    def _cut_off(self) -> None:
        log.info(
            "an HTTP/2 client took none of its responses for %g s: closing its connection",
            self._server.client_timeout,
        )
        self.transport.abort()

    # -- events -----------------------------------------------------------------------------
    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        self._disarm_idle()
        ended = event.stream_ended is not None
        if self._draining:  # after GOAWAY: refused, the client may retry it elsewhere
            self._h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        try:
            head = request_head(list(event.headers))
        except BadRequest as exc:
            self._refuse(sid, exc)
            return
        stream = H2Stream(self, sid, head, self._server.max_body, ended)
        self._streams[sid] = stream
        task = self._loop.create_task(self._run(stream))
        self._tasks[sid] = task

    def _refuse(self, sid: int, exc: BadRequest) -> None:
        """A request that cannot be handled: its error, as HTTP/1.1 gives it, on its stream."""
        body = openai_error_body(exc.status, f"llmobs: {exc}")
        headers = [(b":status", str(exc.status).encode()), (b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        self._h2.send_headers(sid, headers)
        self._h2.send_data(sid, body, end_stream=True)
        on_reject = self._server.on_reject
        if on_reject is not None:
            with contextlib.suppress(Exception):
                on_reject(exc.status, 0.0)

    def _data(self, event: h2.events.DataReceived) -> None:
        sid = event.stream_id
        if event.flow_controlled_length:  # credited back at once: the body's limit bounds it
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self._h2.acknowledge_received_data(event.flow_controlled_length, sid)
        elif not event.stream_ended:
            self._count(1, MAX_CONTROL)  # an empty DATA frame: as a control frame
        stream = self._streams.get(sid)
        if stream is not None and event.data:
            stream.feed(event.data)

    def _ended(self, event: h2.events.StreamEnded) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is not None:
            stream.complete()

    def _reset(self, event: h2.events.StreamReset) -> None:
        sid = event.stream_id
        if event.remote_reset:
            self._count(0, MAX_RESETS)
        stream = self._streams.get(sid)
        if stream is not None:
            stream.tell_gone()
            task = self._tasks.get(sid)
            if task is not None:
                task.cancel()
        self._forget(sid)

    def _window(self, event: h2.events.WindowUpdated) -> None:
        sids = list(self._backlog) if event.stream_id == 0 else [event.stream_id]
        for sid in sids:
            stream = self._streams.get(sid)
            if stream is not None:
                self._pump(stream)

    def _settings(self, event: h2.events.RemoteSettingsChanged) -> None:
        if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
            for sid in list(self._backlog):
                stream = self._streams.get(sid)
                if stream is not None:
                    self._pump(stream)

    def _terminated(self, event: h2.events.ConnectionTerminated) -> None:
        self._draining = True
        if not self._streams:
            self.close()

    _HANDLERS: ClassVar[dict[type[h2.events.Event], Callable[[Any, Any], None]]] = {
        h2.events.RequestReceived: _request,
        h2.events.DataReceived: _data,
        h2.events.StreamEnded: _ended,
        h2.events.StreamReset: _reset,
        h2.events.WindowUpdated: _window,
        h2.events.RemoteSettingsChanged: _settings,
        h2.events.ConnectionTerminated: _terminated,
    }

    def _count(self, kind: int, budget: int) -> None:
        """One more reset (``kind`` 0) or control frame (1) in this window: past ``budget``,
        the connection's end (GOAWAY ENHANCE_YOUR_CALM)."""
        now = self._loop.time()
        if now - self._window_began > FLOOD_WINDOW:
            self._window_began, self._floods = now, [0, 0]
        self._floods[kind] += 1
        if self._floods[kind] > budget and not self.closing:
            what = "stream resets" if kind == 0 else "control frames"
            log.warning("an HTTP/2 client sent too many %s: closing its connection", what)
            self._h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
            self.close()

    # -- requests ---------------------------------------------------------------------------
    async def _run(self, stream: H2Stream) -> None:
        try:
            await self._server.handler(stream)
        except asyncio.CancelledError:
            pass  # the stream was reset, or the connection lost
        except Exception:
            log.exception("%s request: the handler failed", method_label(stream.method))
            if not stream.started and not stream.closed:
                stream.respond_error(500, "llmobs: internal error")
        finally:
            self._done(stream)

    def _done(self, stream: H2Stream) -> None:
        """The handler returned: a response never begun is a 500, one never ended is cut."""
        if not stream.closed:
            if not stream.started:
                stream.respond_error(500, "llmobs: no response")
            elif not stream.ended:
                self.reset(stream)
        self._tasks.pop(stream.id, None)
        if stream.too_large and not stream.reset:  # answered (413): the rest is not wanted
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.reset_stream(stream.id, ErrorCodes.NO_ERROR)
        if stream.id not in self._backlog:
            self._close_request(stream)
            self._forget(stream.id)
        self._after_stream()

    def _close_request(self, stream: H2Stream) -> None:
        """The response is whole and sent while the client's half is still open (a gRPC
        stream answered before its request ended): RST_STREAM NO_ERROR, as RFC 9113 8.1 has
        a server ask the rest not be sent, so that the stream does not stay open."""
        if stream.ended and not stream.body_complete and not stream.reset and not self.closing:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.reset_stream(stream.id, ErrorCodes.NO_ERROR)
            self._flush()

    def _after_stream(self) -> None:
        if self.closing:
            return
        if not self._streams:
            if self._draining:
                self.close_when_done()
            else:
                self._arm_idle()

    def _forget(self, sid: int) -> None:
        self._streams.pop(sid, None)
        self._backlog.pop(sid, None)
        self._ending.pop(sid, None)
        self._held.discard(sid)
        timer = self._stuck.pop(sid, None)
        if timer is not None:
            timer.cancel()

    # -- writing, for the streams -----------------------------------------------------------
    def send_head(
        self, stream: H2Stream, status: int, fields: Iterable[tuple[str, str]], length: int | None
    ) -> None:
        if stream.closed:
            return
        headers = [(b":status", str(status).encode())]
        for name, value in fields:
            lower = name.lower().encode("latin-1")
            if lower not in _CONNECTION_FIELDS:
                headers.append((lower, value.encode("latin-1")))
        if length is not None and not (status == 204 or 100 <= status < 200):
            headers.append((b"content-length", str(length).encode()))
        try:
            self._h2.send_headers(stream.id, headers, end_stream=stream.bodyless)
        except h2.exceptions.ProtocolError as exc:  # a field h2 will not send
            log.warning(
                "%s request: the engine's response head cannot go over HTTP/2 (%s)",
                method_label(stream.method), type(exc).__name__,
            )  # fmt: skip
            self.reset(stream)
            return
        if stream.bodyless:
            stream.ended = True
        self._flush()

    def send_trailers(self, stream: H2Stream, fields: Iterable[tuple[str, str]]) -> None:
        """End ``stream`` with trailers (gRPC's status), after what its backlog holds."""
        if stream.closed:
            return
        block = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in fields
                 if n.lower().encode("latin-1") not in _CONNECTION_FIELDS]  # fmt: skip
        self._ending[stream.id] = block
        self._pump(stream)
        self._flush()

    def send(self, stream: H2Stream, data: bytes, end: bool) -> None:
        """Body bytes for ``stream`` (``end``: its last), sent as far as the windows admit."""
        if stream.closed:
            return
        sid = stream.id
        if sid not in self._backlog:  # the usual case: nothing waiting, and room for it
            h2conn = self._h2
            room = h2conn.local_flow_control_window(sid)
            if len(data) <= room and len(data) <= h2conn.max_outbound_frame_size:
                h2conn.send_data(sid, data, end_stream=end)
                self._floods[1] -= 2
                self.transport.write(h2conn.data_to_send())
                return
        if data:
            self._backlog.setdefault(stream.id, []).append(data)
        if end:
            self._ending[stream.id] = None
        self._pump(stream)
        self._flush()

    def _pump(self, stream: H2Stream) -> None:
        """Send what the stream's backlog holds, as far as the flow-control windows admit;
        end the stream once it is all sent, if its end was asked; pause or resume its engine."""
        sid = stream.id
        parts = self._backlog.get(sid)
        h2conn = self._h2
        sent = False
        try:
            while parts:
                room = min(h2conn.local_flow_control_window(sid), h2conn.max_outbound_frame_size)
                if room <= 0:
                    break
                part = parts[0]
                if len(part) > room:
                    parts[0] = part[room:]
                    part = part[:room]
                else:
                    parts.pop(0)
                h2conn.send_data(sid, part)
                sent = True
                self._floods[1] -= 2  # a DATA frame earns its WINDOW_UPDATEs (stream, connection)
            if not parts and sid in self._ending:
                trailers = self._ending.pop(sid)
                if trailers is None:
                    h2conn.end_stream(sid)
                else:
                    h2conn.send_headers(sid, trailers, end_stream=True)
        except h2.exceptions.StreamClosedError:
            stream.tell_gone()
            self._forget(sid)
            return
        except h2.exceptions.ProtocolError:  # trailers h2 will not send, say: cut, not ended
            self.reset(stream)
            return
        self._flow(stream, sum(map(len, parts)) if parts else 0)
        self._watch(stream, bool(parts), sent)
        if not parts:
            self._backlog.pop(sid, None)
            if stream.id not in self._tasks:
                self._close_request(stream)
                self._forget(sid)
                self._after_stream()

    def _flow(self, stream: H2Stream, backlog: int) -> None:
        """Pause the stream's engine past ``HIGH_WATER``, resume it below ``LOW_WATER``."""
        sid = stream.id
        if backlog > HIGH_WATER and sid not in self._held:
            self._held.add(sid)
            stream.tell_paused()
        elif backlog < LOW_WATER and sid in self._held:
            self._held.discard(sid)
            if not self._writing_paused:
                stream.tell_resumed()

    def _watch(self, stream: H2Stream, waiting: bool, moved: bool) -> None:
        """A backlog that does not move for ``client_timeout`` (a window never opened) has
        its stream reset; each move starts the count again."""
        sid = stream.id
        timer = self._stuck.get(sid)
        if timer is not None and (moved or not waiting):
            timer.cancel()
            del self._stuck[sid]
            timer = None
        if waiting and timer is None:
            wait = self._server.client_timeout
            self._stuck[sid] = self._loop.call_later(wait, self._never_opened, stream)

    def _never_opened(self, stream: H2Stream) -> None:
        self._stuck.pop(stream.id, None)
        log.info("an HTTP/2 client opened no window for %g s: its stream reset",
                 self._server.client_timeout)  # fmt: skip
        self.reset(stream, ErrorCodes.CANCEL)

    def held(self, stream: H2Stream) -> bool:
        """Whether the stream's engine should be paused now."""
        return self._writing_paused or stream.id in self._held

    def reset(self, stream: H2Stream, code: ErrorCodes = ErrorCodes.INTERNAL_ERROR) -> None:
        """End a stream uncleanly (RST_STREAM); its connection carries on."""
        if not stream.reset and not self.closing:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.reset_stream(stream.id, code)
            self._flush()
        stream.ended = True
        stream.tell_gone()
        self._forget(stream.id)

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and not self.closing:
            self.transport.write(data)

    # -- the connection's life --------------------------------------------------------------
    def _arm_idle(self) -> None:
        self._disarm_idle()
        self._idle = self._loop.call_later(self._server.client_timeout, self._idle_timeout)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_timeout(self) -> None:
        if not self._streams:
            self.close_when_done()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The handlers running for the connection's streams."""
        return list(self._tasks.values())

    def close_when_done(self) -> None:
        """No new stream from now on (each refused with REFUSED_STREAM, for the client to
        retry elsewhere); once the streams in flight have ended, GOAWAY and close. GOAWAY
        waits for them: a client built on ``h2`` (httpx's) takes GOAWAY as the connection's
        end, and would lose their responses."""
        self._draining = True
        if not self._streams and not self.closing:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.close_connection()
            self.close()

    def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self.close()

    def close(self) -> None:
        if not self.closing:
            self._flush()
            self.closing = True
            self.transport.close()
