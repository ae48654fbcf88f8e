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
- the body is buffered up to ``max_body`` bytes, read whole by the handler within
  ``client_timeout`` (``BodyTooSlow``, ``BodyTooLarge``); ``Expect: 100-continue`` is
  answered when the handler asks for the body, so a request refused on its head alone (413)
  never makes the client send it;
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
import json
import logging
import re
import socket
import struct
from collections.abc import Awaitable, Callable, Iterable
from email.utils import formatdate
from http import HTTPStatus

try:
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ  # Linux's SIOCOUTQ: bytes in a socket's send queue
except (ImportError, AttributeError):  # elsewhere the send timeout sees the transport only
    _OUTQ = None

from llmobs.config.logs import method_label
from llmobs.wire.http1 import (
    MAX_REQUEST_HEAD_BYTES,
    BadRequest,
    BodyDecoder,
    FieldsTooLarge,
    Framing,
    LengthBody,
    ProtocolError,
    RequestHead,
    content_length,
    expects_continue,
    parse_request_head,
    request_body_decoder,
    request_keep_alive,
    response_framing,
)

log = logging.getLogger("llmobs.server")

MAX_PIPELINED = 256 * 1024  # bytes of later requests buffered while one is handled
PIPELINED_LOW = 64 * 1024  # ... and below which reading starts again (above a whole head)
_LINE_ENDS = re.compile(rb"[\r\n]*")
HIGH_WATER = 256 * 1024  # bytes buffered for a client above which its upstream is paused
LOW_WATER = 64 * 1024  # ... and below which it is resumed

LINGER = 2.0  # seconds an unread request body is drained after a refusal, before closing


def reason_phrase(status: int) -> str:
    """The standard reason phrase of ``status``."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


# What a 405 (CONNECT, refused by the parser) names as allowed: the methods the relay forwards
ALLOW = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

ERROR_TYPES = {
    400: "bad_request",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
    431: "request_too_large",
    500: "internal_error",
    501: "not_implemented",
    502: "upstream_error",
    504: "upstream_timeout",
    505: "bad_request",
}


class BodyTooLarge(Exception):
    """The request body exceeded the configured maximum."""


class BodyTooSlow(Exception):
    """The client kept the server waiting for its request body longer than allowed."""


def error_body(status: int, message: str) -> bytes:
    """An error the sidecar itself produced, in the OpenAI error shape."""
    kind = ERROR_TYPES.get(status, "error")
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


Handler = Callable[["Request"], Awaitable[None]]
# told of each request refused before it could be parsed: its status, seconds since its head began
OnReject = Callable[[int, float], None]


class Request:
    """One request on a connection, and the writing of its response.

    The handler writes the response through ``begin`` (the head), then either the transport
    directly (the relay's hot path, framed as ``chunked`` says) or ``write``, and ``end``; or
    all at once with ``respond``. A handler that returns with a response begun but not ended
    has the connection closed under it (the client sees a cut response).
    """

    __slots__ = (
        "_conn",
        "_decoder",
        "_expect_continue",
        "_flow",
        "_gone",
        "_limit",
        "_parts",
        "_waiter",
        "_wire",
        "backlog",
        "body_complete",
        "bodyless",
        "chunked",
        "content_length",
        "ended",
        "error",
        "head",
        "headers",
        "keep_alive",
        "last_chunk_sent",
        "method",
        "remote",
        "started",
        "target",
        "too_large",
        "transport",
    )

    scheme = "http"

    def __init__(
        self,
        conn: ServerConnection,
        head: RequestHead,
        decoder: BodyDecoder | None,
        limit: int,
    ) -> None:
        self._conn = conn
        self.transport = conn.transport
        self.head = head
        self.method = head.method
        self.target = head.target
        self.headers = head.headers
        self.remote = conn.remote
        self.keep_alive = request_keep_alive(head)
        self._decoder = decoder
        # the declared length (None: none declared, or chunked): the body's decoder knows it
        # (a length of 0 has none)
        if isinstance(decoder, LengthBody):
            self.content_length: int | None = decoder.length
        else:
            self.content_length = content_length(head.headers) if decoder is None else None
        self._limit = limit
        self._parts: list[bytes] = []
        self._wire = 0  # bytes of the body read off the wire, framing included
        # the body's decoder stopped part way through a read, its share of this loop turn
        # done: the connection takes up the rest (``_feed_rest``) in the next turn
        self.backlog = False
        self._waiter: asyncio.Future[None] | None = None
        self._flow: tuple[Callable[[], None], Callable[[], None]] | None = None
        self._gone: Callable[[], None] | None = None
        self._expect_continue = expects_continue(head)
        self.body_complete = decoder is None
        self.too_large = False
        self.error: BadRequest | None = None
        self.started = False
        self.ended = False
        self.chunked = False
        self.bodyless = False
        self.last_chunk_sent = False  # the relay wrote the engine's last chunk as it came

    # -- the request ------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self.head.path

    @property
    def has_body(self) -> bool:
        """Whether the request declares a body (a length above zero, or chunked)."""
        return self._decoder is not None

    @property
    def refused(self) -> bool:
        """The body was cut short (too large, or broken framing): the connection cannot carry
        another request, since where this one ends is unknown or unread."""
        return self.too_large or self.error is not None

    def _feed(self, data: bytes) -> bytes:
        """Body bytes off the wire; returns what follows the body (a pipelined request)."""
        if self.refused:
            return b""  # the rest of a refused body is never read as requests
        self._wire += len(data)
        return self._decode(data)

    def _feed_rest(self) -> bytes:
        """The rest of a read the decoder left (``backlog``); returns as ``_feed`` does."""
        if self.refused:
            self.backlog = False
            return b""
        return self._decode(None)

    def _decode(self, data: bytes | None) -> bytes:
        decoder = self._decoder
        assert decoder is not None
        try:
            payload = decoder.feed(data) if data is not None else decoder.resume()
        except FieldsTooLarge:
            self.error = BadRequest(431, "request trailer section too large")
            self.backlog = False
            self._complete()
            return b""
        except ProtocolError as exc:
            self.error = BadRequest(400, f"malformed request body: {exc}")
            self.backlog = False
            self._complete()
            return b""
        # The limit is on the body as it comes over the wire, its framing (size lines,
        # extensions, trailers) included: that is what costs work to read.
        self.backlog = decoder.backlog
        wire = self._wire
        if wire > self._limit and wire - decoder.pending() - len(decoder.extra) > self._limit:
            self.backlog = False
            self.too_large = True
            self._parts.clear()
            self._complete()
            return b""
        if payload:
            self._parts.append(payload)
        if decoder.done and not self.body_complete:
            self._complete()
            return decoder.extra
        return b""

    def _complete(self) -> None:
        self.body_complete = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read_body(self, budget: float) -> bytes:
        """The whole body; ``BodyTooSlow`` if it takes longer than ``budget`` seconds,
        ``BodyTooLarge`` past the limit, ``BadRequest`` if its framing is broken."""
        if not self.body_complete:
            if self._expect_continue:
                self._expect_continue = False
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(budget):
                    await self._waiter
            except TimeoutError:
                raise BodyTooSlow from None
            finally:
                self._waiter = None
        if self.too_large:
            raise BodyTooLarge
        if self.error is not None:
            raise self.error
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    # -- the response -----------------------------------------------------------------------
    def begin(
        self,
        status: int,
        reason: str,
        headers: Iterable[tuple[str, str]],
        length: int | None,
    ) -> None:
        """Write the response head: ``headers`` as given (no framing headers among them),
        then the framing: ``length`` bytes, else chunked (HTTP/1.1) or until close."""
        # A body not (wholly) read cannot be skipped to find the next request: say so.
        keep = (
            self.keep_alive and self.body_complete and not self.refused and not self._conn.closing
        )
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines.extend(f"{k}: {v}" for k, v in headers)
        framing = response_framing(self.method, status, self.head.version, length)
        if framing is Framing.NONE:
            self.bodyless = True
            if length is not None and status != 204:
                lines.append(f"Content-Length: {length}")  # what a GET would have had
        elif framing is Framing.LENGTH:
            lines.append(f"Content-Length: {length}")
        elif framing is Framing.CHUNKED:
            lines.append("Transfer-Encoding: chunked")
            self.chunked = True
        else:
            keep = False  # HTTP/1.0 and no length: the body ends with the connection
        if not keep:
            lines.append("Connection: close")
        elif self.head.version < (1, 1):
            lines.append("Connection: keep-alive")
        self.keep_alive = keep
        lines.append("\r\n")
        self.started = True
        self.transport.write("\r\n".join(lines).encode("latin-1"))

    def write(self, data: bytes) -> None:
        """Body bytes, framed as the head said (none at all for HEAD, 204, 304)."""
        if not data or self.bodyless:
            return
        if self.chunked:
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.transport.write(data)

    def end(self) -> None:
        """The end of the response (the last chunk, when chunked)."""
        if (
            self.chunked
            and not self.bodyless
            and not self.last_chunk_sent
            and not self.transport.is_closing()
        ):
            self.transport.write(b"0\r\n\r\n")
        self.ended = True

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        *,
        close: bool = False,
    ) -> None:
        """A whole response the server produces itself (errors)."""
        if close:
            self.keep_alive = False
        headers = [("Content-Type", content_type), ("Date", formatdate(usegmt=True))]
        self.begin(status, reason_phrase(status), headers, len(body))
        self.write(body)
        self.end()

    def respond_error(self, status: int, message: str, *, close: bool = False) -> None:
        self.respond(status, error_body(status, message), close=close)

    def on_flow(self, pause: Callable[[], None] | None, resume: Callable[[], None] | None) -> None:
        """Call ``pause`` when the client's write buffer passes ``HIGH_WATER`` and ``resume``
        when it is back under ``LOW_WATER`` (the relay pauses the engine's connection);
        ``None`` stops it."""
        self._flow = (pause, resume) if pause is not None and resume is not None else None
        if self._flow is not None and self._conn.paused_writing:
            pause()  # type: ignore[misc]  # not None, checked above

    def on_gone(self, gone: Callable[[], None] | None) -> None:
        """Call ``gone`` once when the client goes away (its EOF, or the connection lost)
        while the handler runs; ``None`` stops it. The handler is cancelled too, but only on
        the loop's next round, and the source may deliver more before then: this stops it at
        once, so that nothing is written to a closed transport and the relay's hot path needs
        no check of its own per write. (A source whose response has already ended, in that
        same round, may ignore it: the client had it all.)"""
        self._gone = gone

    def _tell_gone(self) -> None:
        gone, self._gone = self._gone, None
        if gone is not None:
            try:
                gone()
            except Exception:  # the handler's bug: the connection's cleanup goes on
                log.exception("%s request: on_gone failed", method_label(self.method))

    def _pause(self) -> None:
        if self._flow is not None:
            self._flow[0]()

    def _resume(self) -> None:
        if self._flow is not None:
            self._flow[1]()

    def abort(self) -> None:
        """Close the connection now, without the response's clean end."""
        self.transport.close()


class ServerConnection(asyncio.Protocol):
    """One client connection: parses requests, runs the handler for one at a time."""

    def __init__(self, server: ProxyServer) -> None:
        self._server = server
        self._loop = server.loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.remote = ""
        self.closing = False  # close once the current response has ended
        # Bytes read but not handled yet (a head coming in, pipelined requests) from
        # ``_at`` on: a request taken from the front moves ``_at``, copying nothing.
        self._buf = b""
        self._at = 0
        self._head_t = 0.0  # when the head in ``_buf`` began to arrive (loop time)
        self._request: Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None  # the send timeout, while paused
        self._stalled_at = 0  # bytes the client had not taken at the last check
        self._fd = -1  # the socket, for its kernel send queue (the send timeout)
        self._paused = False
        self._turn: asyncio.Handle | None = None  # the body's next share of work (``_yield``)
        self._lingering = False
        self.paused_writing = False

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._fd = sock.fileno()
        self.transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._server.connections.add(self)
        if self._server.closing:
            self.transport.close()
            return
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the unread rest of a refused request: drained, then closed
        request = self._request
        if request is not None:
            if request.refused:
                return
            if not request.body_complete:
                data = request._feed(data)
                if request.backlog:
                    self._yield()
                    return
                if not data:
                    return
            self._pipelined(data)
            return
        if self._buf:
            self._buf = self._buf[self._at :] + data
        else:  # a new request's head begins
            self._buf = data
            self._head_t = self._loop.time()
        self._at = 0
        self._next()

    def _pipelined(self, data: bytes) -> None:
        """Bytes after the current request: the next ones, handled after it (bounded)."""
        self._buf = self._buf[self._at :] + data
        self._at = 0
        if len(self._buf) > MAX_PIPELINED and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def _yield(self) -> None:
        """The request body's decoder had its share of this loop turn: stop reading, and
        decode the rest of the read in the next turn, after the other connections' reads
        (a body of tiny chunks is then a slow upload, not a stall of every stream)."""
        if self._turn is None:
            self.transport.pause_reading()
            self._turn = self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn = None
        request = self._request
        if self._lingering or self.transport.is_closing():
            return  # (a lingering close reads again itself)
        if request is not None:
            rest = request._feed_rest()
            if request.backlog:
                self._turn = self._loop.call_soon(self._next_turn)
                return
            if rest:
                self._pipelined(rest)
        if not self._paused:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.paused_writing = True
        if self._stalled is None:
            self._arm_send_timeout(self._unsent())
        if self._request is not None:
            self._request._pause()

    def resume_writing(self) -> None:
        self.paused_writing = False
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if self._request is not None:
            self._request._resume()

    def _arm_send_timeout(self, left: int) -> None:
        """Check again in ``client_timeout`` whether the client took any of ``left`` bytes."""
        self._stalled_at = left
        self._stalled = self._loop.call_later(self._server.client_timeout, self._send_timeout)

    def _unsent(self) -> int:
        """Bytes written for the client that it has not taken: the transport's buffer and
        the kernel's send queue. The latter holds up to a few MiB (autotuned), and the
        transport's buffer moves only when a third of it frees, so a client reading steadily
        but slowly is seen to make progress only in the kernel's count."""
        left = self.transport.get_write_buffer_size()
        if _OUTQ is not None and self._fd >= 0:
            with contextlib.suppress(OSError):
                left += struct.unpack("i", fcntl.ioctl(self._fd, _OUTQ, b"\0\0\0\0"))[0]
        return left

    def _send_timeout(self) -> None:
        """``client_timeout`` since the pause, or since the last check: a client that took
        some of what it was sent meanwhile gets another period (a slow reader is not a
        stalled one); one that took nothing is cut off (its handler is cancelled, the
        engine's connection closed with it)."""
        left = self._unsent()
        if left < self._stalled_at:
            self._arm_send_timeout(left)
            return
        self._stalled = None
        log.info(
            "a client took none of its response for %g s: closing its connection",
            self._server.client_timeout,
        )
        self.transport.abort()

    def eof_received(self) -> bool:
        if self._request is not None:
            self._request._tell_gone()
        return False  # the client is gone: close (and cancel its handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._request is not None:
            self._request._tell_gone()  # before the cancellation, which lands a round later
        self._server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        task = self._task
        if task is not None and not task.done():
            task.cancel()

    # -- requests ---------------------------------------------------------------------------
    def _arm_idle(self) -> None:
        self._idle = self._loop.call_later(self._server.client_timeout, self._idle_timeout)

    def _idle_timeout(self) -> None:
        if self._request is None:  # no complete head in time: idle, or a slowloris
            self.transport.close()

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
            elif self._paused:
                self._read_more()
            return
        try:
            head = parse_request_head(buf[at:end])
            decoder = request_body_decoder(head)
        except BadRequest as exc:
            self._reject(exc)
            return
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        request = Request(self, head, decoder, self._server.max_body)
        self._request = request
        at = end + 4
        if at < len(buf) and decoder is not None:
            buf, at = request._feed(buf[at:]), 0
            if request.backlog:
                self._yield()
        if at < len(buf):
            self._buf, self._at = buf, at  # pipelined requests, taken when this one ends
        else:
            self._buf, self._at = b"", 0
        if self._paused:
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
            self._paused = False
            if self._turn is None:
                self.transport.resume_reading()

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
        body = error_body(exc.status, f"llmobs: {exc}")
        allow = f"Allow: {ALLOW}\r\n" if exc.status == 405 else ""  # RFC 9110 15.5.6
        head = (
            f"HTTP/1.1 {exc.status} {reason_phrase(exc.status)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{allow}"
            "Connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self._linger()

    def _linger(self) -> None:
        """Close after a refusal, without losing the answer: the client may still be
        sending, and closing with unread bytes resets the connection, which can discard the
        response in flight. So half-close (the answer, then FIN), drain what comes for up
        to ``LINGER`` seconds, then close (nginx's lingering close)."""
        transport = self.transport
        if transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        self._buf, self._at = b"", 0
        turn, self._turn = self._turn, None
        if self._paused or turn is not None:
            self._paused = False
            if turn is not None:
                turn.cancel()
            transport.resume_reading()
        transport.write_eof()
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self._loop.call_later(LINGER, transport.close)

    async def _run(self, request: Request) -> None:
        try:
            await self._server.handler(request)
        except asyncio.CancelledError:
            pass  # the client went away (or shutdown gave up waiting): the transport is closed
        except Exception:
            log.exception("%s request: the handler failed", method_label(request.method))
            if not request.started and not self.transport.is_closing():
                request.respond_error(500, "llmobs: internal error", close=True)
        finally:
            self._done(request)

    def _done(self, request: Request) -> None:
        self._request = None
        self._task = None
        transport = self.transport
        if transport.is_closing():
            return
        if not request.started:
            request.respond_error(500, "llmobs: no response", close=True)
        elif not request.ended:
            transport.close()  # cut short: the client must not take it for a whole response
            return
        if not request.body_complete or request.refused:
            self._linger()  # the rest of the body was never read
            return
        if not request.keep_alive or self.closing:
            transport.close()
            return
        self._arm_idle()
        if self._buf:  # a pipelined request: its turn starts now
            self._head_t = self._loop.time()
            self._next()
        elif self._paused:
            self._read_more()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The handler running for the current request."""
        return self._task

    def close_when_done(self) -> None:
        """Shutdown: close now if idle, else once the current response has ended."""
        self.closing = True
        if self._request is None:
            self.transport.close()

    def cancel(self) -> None:
        """Shutdown gave up waiting: cancel the handler and close."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.transport.close()


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
    ) -> None:
        self.handler = handler
        self.on_reject = on_reject
        self.client_timeout = client_timeout
        self.max_body = max_body
        self.loop = loop or asyncio.get_running_loop()
        self.connections: set[ServerConnection] = set()
        self.closing = False
        self._servers: list[asyncio.Server] = []

    async def listen(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: any free port); returns the port bound."""
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
        for conn in list(self.connections):
            conn.close_when_done()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:  # no new ones start: each connection closes after its current response
            await asyncio.wait(tasks, timeout=grace)
        for conn in list(self.connections):
            conn.cancel()
        await asyncio.sleep(0)  # let the cancelled handlers run their cleanup
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._servers.clear()
