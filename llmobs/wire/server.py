"""The client leg: a lean HTTP/1.1 server for the relay, at the protocol level.

Why not a web framework's server: per request it builds a request object, a payload stream,
a router match, a response object and its header writer, and wakes a task between each read
of the request and the handler. For a relay that adds up to a few hundred microseconds of CPU
per request and a scheduler round or two of latency before the request reaches the engine
(docs/benchmarks.md). Here the head is parsed (``http1``) inside ``data_received`` and the
handler task starts at once; a body that came with the head is there when the handler runs.

What it does, as a reverse proxy's client side should:
- keep-alive and pipelining: requests on a connection are answered one at a time, in order;
- a request's headers must be complete ``client_timeout`` after the accept or the end of the
  previous response, else the connection is closed (an idle or slowloris client);
- the body is buffered up to ``max_body`` bytes and read whole by the handler (``request``);
- a client that stops reading its response pauses the handler's source (``on_flow``); one
  that then takes nothing of it for ``client_timeout`` (neither from the transport's buffer
  nor, on Linux, from the kernel's send queue) is cut off, as by nginx's ``send_timeout``,
  so a stalled reader cannot hold a stream and its engine slot;
- a malformed request gets a JSON 400, 431, 501 or 505 and the connection is closed;
- a client going away (reset, close or EOF) cancels its handler, which stops the upstream
  work; a handler that relays from a source can also be told at once (``on_gone``), since
  the cancellation lands a loop round later and a closed transport must not be written to;
- shutdown stops accepting, closes idle connections and lets handlers finish (``shutdown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable

from llmobs.config.logs import method_label
from llmobs.wire.accept import OnHandshake, TlsListener
from llmobs.wire.carrier import Carrier
from llmobs.wire.flow import Reading, SendTimeout
from llmobs.wire.h2 import PREFACE, H2ServerConnection
from llmobs.wire.http1 import (
    MAX_REQUEST_HEAD_BYTES,
    BadRequest,
    parse_request_head,
    request_body_decoder,
)
from llmobs.wire.request import BodyTooLarge, BodyTooSlow, Request, refusal
from llmobs.wire.states import (
    CLIENT_HANDLING,
    CLIENT_RECEIVING,
    CLIENT_UNANSWERED,
    ClientEvent,
    ClientState,
    WriteEvent,
)

# the handler's side of a request is re-exported: the relay and its tests take it from here
__all__ = ["BodyTooLarge", "BodyTooSlow", "ProxyServer", "Request", "ServerConnection"]

log = logging.getLogger("llmobs.server")

MAX_PIPELINED = 256 * 1024  # bytes of later requests buffered while one is handled
PIPELINED_LOW = 64 * 1024  # ... and below which reading starts again (above a whole head)
_LINE_ENDS = re.compile(rb"[\r\n]*")
HIGH_WATER = 256 * 1024  # bytes buffered for a client above which its upstream is paused
LOW_WATER = 64 * 1024  # ... and below which it is resumed

LINGER = 2.0  # seconds an unread request body is drained after a refusal, before closing
_PRI = PREFACE[:14]  # HTTP/2's preface, as far as the HTTP/1.1 reader takes it for a head

Handler = Callable[[Request], Awaitable[None]]
# told of each request refused before it could be parsed: its status, seconds since its head began
OnReject = Callable[[int, float], None]

# the states and events by name, as module globals: the connection's dispatch reads them per read
_IDLE, _LINGERING, _CLOSING = ClientState.IDLE, ClientState.LINGERING, ClientState.CLOSING
_HEAD, _REQUEST, _BODY = ClientEvent.HEAD, ClientEvent.REQUEST, ClientEvent.BODY
_BAD_BODY, _SHUTDOWN, _DONE = ClientEvent.BAD_BODY, ClientEvent.SHUTDOWN, ClientEvent.DONE
_LINGER, _CLOSE, _LOST = ClientEvent.LINGER, ClientEvent.CLOSE, ClientEvent.LOST
_PAUSE, _RESUME = WriteEvent.PAUSE, WriteEvent.RESUME


class ServerConnection(Carrier, asyncio.Protocol):
    """One client connection: parses requests, runs the handler for one at a time.

    Its ``state`` (``states.ClientState``, moved as ``Carrier`` does) says what a read is: a
    head coming (``IDLE``), the request's body, the next requests, or to be dropped; how far
    the response went; and what follows the handler's return (the next request, the close,
    or a lingering close).
    """

    def __init__(self, server: ProxyServer) -> None:
        super().__init__()
        self._server = server
        self._loop = loop = server.loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.remote = ""
        self.scheme = "http"
        # Bytes read but not handled yet (a head coming in, pipelined requests) from
        # ``_at`` on: a request taken from the front moves ``_at``, copying nothing.
        self._buf = b""
        self._at = 0
        self._head_t = 0.0  # when the head in ``_buf`` began to arrive (loop time)
        self._request: Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        # reading: held while pipelined requests back up, deferred while a body is decoded
        # a share per loop turn
        self._reading = Reading(loop)
        self._sending = SendTimeout(loop, server.client_timeout)
        self._switched = False  # a 101: the transport is the handler's (``switched``)

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self._reading.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        fd = -1  # the socket, for its kernel send queue (the send timeout)
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fd = sock.fileno()
        self._sending.watch(self.transport, fd)
        self.transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if transport.get_extra_info("ssl_object") is not None:
            self.scheme = "https"
        self._server.connections.add(self)
        if self._server.closing:
            self.close()
            return
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state is _IDLE:
            if self._buf:
                self._buf = self._buf[self._at :] + data
            else:  # a new request's head begins
                self._buf = data
                self._head_t = self._loop.time()
            self._at = 0
            self._next()
        elif state in CLIENT_RECEIVING:
            self._receive(data)
        elif state in CLIENT_HANDLING:
            self._pipelined(data)
        # else the unread rest of a refused request: dropped (drained, then closed)

    def _receive(self, data: bytes) -> None:
        """Bytes of the current request's body, and maybe of the next requests."""
        request = self._request
        assert request is not None
        data = request.feed(data)
        if request.backlog:
            self._reading.defer(self._body_share)
            return
        if request.body_complete:
            self._go(_BAD_BODY if request.refused else _BODY)
        if data:
            self._pipelined(data)

    def _body_share(self) -> bool:
        """The next share of the body's read (``Reading``'s work): True while more is left."""
        request = self._request
        if self.state not in CLIENT_RECEIVING or request is None:
            return False  # (a lingering close reads again itself)
        rest = request.feed(None)
        if request.backlog:
            return True
        if request.body_complete:
            self._go(_BAD_BODY if request.refused else _BODY)
        if rest:
            self._pipelined(rest)
        return False

    def _pipelined(self, data: bytes) -> None:
        """Bytes after the current request: the next ones, handled after it (bounded)."""
        self._buf = self._buf[self._at :] + data
        self._at = 0
        if len(self._buf) > MAX_PIPELINED:
            self._reading.hold()

    def pause_writing(self) -> None:
        if self.flow(_PAUSE):
            self._sending.pause(self._stalled)
            if self._request is not None:
                self._request.tell_paused()

    def resume_writing(self) -> None:
        if self.flow(_RESUME):
            self._sending.stop()
            if self._request is not None:
                self._request.tell_resumed()

    def _stalled(self) -> None:
        """``client_timeout`` since the pause, and the client took none of its response: cut
        off (its handler is cancelled, the engine's connection closed with it)."""
        log.info(
            "a client took none of its response for %g s: closing its connection",
            self._server.client_timeout,
        )
        self.transport.abort()
        self._go(_CLOSE)

    def eof_received(self) -> bool:
        if self._request is not None:
            self._request.tell_gone()
        self._go(_CLOSE)
        return False  # the client is gone: close (and cancel its handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._request is not None:
            self._request.tell_gone()  # before the cancellation, which lands a round later
        self._go(_LOST)
        self._server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        self._reading.stop()
        self._sending.stop()
        task = self._task
        if task is not None and not task.done():
            task.cancel()

    # -- requests ---------------------------------------------------------------------------
    def _arm_idle(self) -> None:
        self._idle = self._loop.call_later(self._server.client_timeout, self._idle_timeout)

    def _idle_timeout(self) -> None:
        if self.state is _IDLE:  # no complete head in time: idle, or a slowloris
            self.close()

    def _next(self) -> None:
        """Start the next request if its head is complete."""
        buf, at = self._buf, self._at
        if buf[at : at + 2] == b"\r\n":  # RFC 9112 2.2: a stray CRLF before a request is ignored
            at = _LINE_ENDS.match(buf, at).end()  # type: ignore[union-attr]  # always matches
        end = buf.find(b"\r\n\r\n", at)
        if end < 0 or end - at > MAX_REQUEST_HEAD_BYTES:
            self._at = at
            # the limit is on the head; up to 3 bytes of its blank line may be here too
            if end - at > MAX_REQUEST_HEAD_BYTES or len(buf) - at > MAX_REQUEST_HEAD_BYTES + 3:
                self._reject(BadRequest(431, "request head too large"))
            elif self._reading.held:
                self._read_more()
            return
        try:
            head = parse_request_head(buf[at:end])
            decoder = request_body_decoder(head)
        except BadRequest as exc:
            if buf[at:end] == _PRI and self._server.http2:  # HTTP/2 with prior knowledge
                self._prior_knowledge(buf, at)
            else:
                self._reject(exc)
            return
        self._start(Request(self, head, decoder, self._server.max_body), buf, end + 4)

    def _prior_knowledge(self, buf: bytes, at: int) -> None:
        """The client's first bytes began HTTP/2's preface (h2c with prior knowledge, as a
        gateway sends to a pool declared h2c): the connection is HTTP/2's from here on,
        once the preface's rest has come."""
        if len(buf) - at < len(PREFACE):
            self._at = at
            return  # the rest of the preface to come
        if buf[at : at + len(PREFACE)] != PREFACE:
            self._reject(BadRequest(505, "HTTP version not supported"))
            return
        if self._idle is not None:
            self._idle.cancel()
        self._reading.stop()
        self._sending.stop()
        self._server.connections.discard(self)
        h2conn = H2ServerConnection(self._server, buf[at:])
        self.transport.set_protocol(h2conn)
        h2conn.connection_made(self.transport)

    def switched(self) -> bytes:
        """The handler's response was 101: from here its transport is the handler's (a
        tunnel's), this connection reads no more; what came after the request goes with it.
        It stays among the server's connections until its handler returns (a shutdown waits
        for it, then cancels it)."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._reading.stop()
        self._sending.stop()
        self._switched = True
        rest = self._buf[self._at :]
        self._buf, self._at = b"", 0
        return rest

    def _start(self, request: Request, buf: bytes, at: int) -> None:
        """Run the handler for ``request``, whose head ends at ``at`` in ``buf``; what follows
        is its body, then the next requests."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._request = request
        if at < len(buf) and not request.body_complete:  # (a body to come: it has one)
            buf, at = request.feed(buf[at:]), 0
            if request.backlog:
                self._reading.defer(self._body_share)
        if at < len(buf):
            self._buf, self._at = buf, at  # pipelined requests, taken when this one ends
        else:
            self._buf, self._at = b"", 0
        arrived = _HEAD  # what came of the request: its head, or all of it
        if request.body_complete:
            arrived = _BAD_BODY if request.refused else _REQUEST
        if self._go(arrived) is None:
            return
        if self._reading.held:
            self._read_more()
        self._task = self._loop.create_task(self._run(request))

    def _read_more(self) -> None:
        """Read again, after a pause for pipelined requests, once what is buffered runs low
        (each read appends to what is left of the buffer, so it is copied once per read, not
        once per request), or a body has yet to come."""
        request = self._request
        if len(self._buf) - self._at < PIPELINED_LOW or (
            request is not None and not request.body_complete
        ):
            self._reading.release()

    def _reject(self, exc: BadRequest) -> None:
        """Answer a request that cannot be parsed, and close (the stream is out of sync).
        It still ends in an outcome (``on_reject``): malformed requests are worth seeing."""
        self._buf, self._at = b"", 0
        log.debug("rejected a request: %s", exc)
        on_reject = self._server.on_reject
        if on_reject is not None:
            try:
                on_reject(exc.status, self._loop.time() - self._head_t)
            except Exception:
                log.exception("could not record a rejected request")
        self.transport.write(refusal(exc))
        if self._go(_LINGER) is _LINGERING:
            self._linger()

    def _linger(self) -> None:
        """Close after a refusal (the state is ``LINGERING``), without losing the answer: the
        client may still be sending, and closing with unread bytes resets the connection,
        which can discard the response in flight. So half-close (the answer, then FIN), drain
        what comes for up to ``LINGER`` seconds, then close (nginx's lingering close)."""
        transport = self.transport
        if transport.is_closing() or not transport.can_write_eof():
            self.close()
            return
        self._buf, self._at = b"", 0
        self._reading.reset()
        transport.write_eof()
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self._loop.call_later(LINGER, self.close)

    async def _run(self, request: Request) -> None:
        try:
            await self._server.handler(request)
        except asyncio.CancelledError:
            pass  # the client went away (or shutdown gave up waiting): the transport is closed
        except Exception:
            log.exception("%s request: the handler failed", method_label(request.method))
            if self.state in CLIENT_UNANSWERED and not self.transport.is_closing():
                request.respond_error(500, "llmobs: internal error", close=True)
        finally:
            self._done(request)

    def _done(self, request: Request) -> None:
        """The handler returned: the state says what follows (``DONE``): the next request,
        the close, or a lingering close."""
        self._request = None
        self._task = None
        if self._switched:  # its connection_lost is the tunnel's
            self._server.connections.discard(self)
        if self.transport.is_closing():
            self._go(_CLOSE)
            return
        if self.state in CLIENT_UNANSWERED:
            request.respond_error(500, "llmobs: no response", close=True)
        after = self._go(_DONE)
        if after is _IDLE:
            self._arm_idle()
            if self._buf:  # a pipelined request: its turn starts now
                self._head_t = self._loop.time()
                self._next()
            elif self._reading.held:
                self._read_more()
        elif after is _LINGERING:
            self._linger()
        elif after is _CLOSING:
            self.transport.close()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The handler running for the current request, if one is."""
        return [self._task] if self._task is not None else []

    def close_when_done(self) -> None:
        """Shutdown: close now if idle, else once the current response has ended."""
        if self._go(_SHUTDOWN) is _CLOSING:
            self.transport.close()

    def cancel(self) -> None:
        """Shutdown gave up waiting: cancel the handler and close."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.close()


class _Negotiated(asyncio.Protocol):
    """A TLS connection's protocol until its handshake is done, then the one ALPN chose: h2,
    else HTTP/1.1 (a client that offered nothing)."""

    def __init__(self, server: ProxyServer) -> None:
        self._server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tls = transport.get_extra_info("ssl_object")
        chosen = tls.selected_alpn_protocol() if tls is not None else None
        conn: asyncio.Protocol = (
            H2ServerConnection(self._server) if chosen == "h2" else ServerConnection(self._server)
        )
        transport.set_protocol(conn)
        conn.connection_made(transport)


class ProxyServer:
    """Listens, and runs ``handler`` for each request on each connection."""

    def __init__(
        self,
        handler: Handler,
        *,
        client_timeout: float,
        max_body: int,
        loop: asyncio.AbstractEventLoop | None = None,
        on_reject: OnReject | None = None,
        on_handshake: OnHandshake | None = None,
        http2: bool = True,
    ) -> None:
        self.handler = handler
        self.on_reject = on_reject
        self.on_handshake: OnHandshake = on_handshake or (lambda result: None)
        self.http2 = http2
        self.client_timeout = client_timeout
        self.max_body = max_body
        self.loop = loop or asyncio.get_running_loop()
        self.connections: set[ServerConnection | H2ServerConnection] = set()
        self.closing = False
        self._servers: list[asyncio.Server] = []
        self._tls: list[TlsListener] = []

    async def listen(
        self, host: str, port: int, tls: Callable[[], ssl.SSLContext] | None = None
    ) -> int:
        """Listen on ``host``:``port`` (0: any free port); returns the port bound. With
        ``tls`` (the context to use now: a rotated certificate applies to new connections),
        each connection shakes hands first, within the client timeout, its result counted."""
        if tls is not None:
            listener = TlsListener(
                tls, lambda: _Negotiated(self), self.client_timeout, self.on_handshake
            )
            self._tls.append(listener)
            return await listener.listen(host, port)
        server = await self.loop.create_server(
            lambda: ServerConnection(self), host, port, reuse_address=True, backlog=1024
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1]) if server.sockets else port

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, close idle connections, wait up to ``grace`` seconds for the
        requests in flight, then cancel what is left."""
        self.closing = True
        for server in self._servers:
            server.close()
        for listener in self._tls:
            listener.close()
        self._tls.clear()
        for conn in list(self.connections):
            conn.close_when_done()
        tasks = [task for c in self.connections for task in c.tasks]
        if tasks:  # no new ones start: each connection closes after its current response
            await asyncio.wait(tasks, timeout=grace)
        for conn in list(self.connections):
            conn.cancel()
        await asyncio.sleep(0)  # let the cancelled handlers run their cleanup
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._servers.clear()
