"""A request on the client leg, and the writing of its response: what a handler gets.

The connection (``server.ServerConnection``) parses the head and hands the body's bytes to
``feed`` as they come; the handler reads the body whole (``read_body``) and writes the
response (``begin``, ``write``, ``end``, or ``respond``; the relay's whole chunks through
``write_chunks`` and ``write_last``), each step told to the connection, whose state it moves
(``carrier.Carrier``). The connection tells the request of its client's flow (``tell_paused``,
``tell_resumed``) and departure (``tell_gone``), which the handler hears through ``on_flow``
and ``on_gone``.

The body is buffered up to ``max_body`` bytes (its framing counted), read whole by the
handler within ``client_timeout`` (``BodyTooSlow``, ``BodyTooLarge``); ``Expect:
100-continue`` is answered when the handler asks for the body, so a request refused on its
head alone (413) never makes the client send it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from email.utils import formatdate
from http import HTTPStatus

from llmobs.config.logs import method_label
from llmobs.wire.carrier import Carrier
from llmobs.wire.http1 import (
    BadRequest,
    BodyDecoder,
    FieldsTooLarge,
    LengthBody,
    ProtocolError,
    RequestHead,
    ResponseFraming,
    content_length,
    expects_continue,
    request_keep_alive,
    response_framing,
)
from llmobs.wire.states import WriteState

log = logging.getLogger("llmobs.server")

_PAUSED = WriteState.PAUSED  # the client's buffer over its high mark (``Carrier.writing``)


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


def openai_error_body(status: int, message: str) -> bytes:
    """An error the sidecar itself produced, in the OpenAI error shape (the dialects' own
    shapes: ``observe.dialects.errors``)."""
    kind = ERROR_TYPES.get(status, "error")
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def refusal(exc: BadRequest) -> bytes:
    """The whole answer to a request refused before it could be handled, closing."""
    body = openai_error_body(exc.status, f"llmobs: {exc}")
    allow = f"Allow: {ALLOW}\r\n" if exc.status == 405 else ""  # RFC 9110 15.5.6
    head = (
        f"HTTP/1.1 {exc.status} {reason_phrase(exc.status)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{allow}"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class Hooks:
    """What a handler is told of its client while it runs, whatever the transport: the flow
    of its response (``on_flow``) and the client's departure (``on_gone``); the connection
    tells (``tell_paused``, ``tell_resumed``, ``tell_gone``)."""

    __slots__ = ("_flow", "_gone", "method")

    method: str

    def __init__(self) -> None:
        self._flow: tuple[Callable[[], None], Callable[[], None]] | None = None
        self._gone: Callable[[], None] | None = None

    def _held(self) -> bool:
        """Whether the response's writing is held back now (the client's buffer full)."""
        raise NotImplementedError

    def on_flow(self, pause: Callable[[], None] | None, resume: Callable[[], None] | None) -> None:
        """Call ``pause`` when the client's write buffer passes ``HIGH_WATER`` and ``resume``
        when it is back under ``LOW_WATER`` (the relay pauses the engine's connection);
        ``None`` stops it."""
        self._flow = (pause, resume) if pause is not None and resume is not None else None
        if self._flow is not None and self._held():
            pause()  # type: ignore[misc]  # not None, checked above

    def on_gone(self, gone: Callable[[], None] | None) -> None:
        """Call ``gone`` once when the client goes away (its EOF, or the connection lost)
        while the handler runs; ``None`` stops it. The handler is cancelled too, but only on
        the loop's next round, and the source may deliver more before then: this stops it at
        once, so that nothing is written to a closed transport and the relay's hot path needs
        no check of its own per write. (A source whose response has already ended, in that
        same round, may ignore it: the client had it all.)"""
        self._gone = gone

    def tell_gone(self) -> None:
        """The client went away (the connection's EOF or loss): ``on_gone``'s callback, once."""
        gone, self._gone = self._gone, None
        if gone is not None:
            try:
                gone()
            except Exception:  # the handler's bug: the connection's cleanup goes on
                log.exception("%s request: on_gone failed", method_label(self.method))

    def tell_paused(self) -> None:
        """The client's write buffer passed ``HIGH_WATER``: ``on_flow``'s pause."""
        if self._flow is not None:
            self._flow[0]()

    def tell_resumed(self) -> None:
        """The client's write buffer is back under ``LOW_WATER``: ``on_flow``'s resume."""
        if self._flow is not None:
            self._flow[1]()


class Request(Hooks):
    """One request on a connection, and the writing of its response.

    The handler writes the response through ``begin`` (the head), then ``write``, or whole
    chunks as they came (``write_chunks``, the relay's hot path; ``write_last`` with the last
    chunk), and ``end``; or all at once with ``respond``. A handler that returns with a
    response begun but not ended has the connection closed under it (the client sees a cut
    response).
    """

    __slots__ = (
        "_conn",
        "_decoder",
        "_expect_continue",
        "_limit",
        "_parts",
        "_waiter",
        "_wire",
        "backlog",
        "body_complete",
        "bodyless",
        "chunked",
        "content_length",
        "error",
        "has_body",
        "head",
        "headers",
        "keep_alive",
        "path",
        "remote",
        "scheme",
        "started",
        "target",
        "too_large",
        "transport",
        "write_chunks",
    )

    def __init__(
        self,
        conn: Carrier,
        head: RequestHead,
        decoder: BodyDecoder | None,
        limit: int,
    ) -> None:
        super().__init__()
        self._conn = conn
        self.transport = conn.transport
        self.head = head
        self.method = head.method
        self.target = head.target
        self.path = head.path
        self.headers = head.headers
        self.remote = conn.remote
        self.scheme = conn.scheme
        self.keep_alive = request_keep_alive(head)  # the client's wish (the state decides)
        self._decoder = decoder
        self.has_body = decoder is not None  # it declares one: a length above zero, or chunked
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
        # done: the connection takes up the rest (``feed(None)``) in the next turn
        self.backlog = False
        self._waiter: asyncio.Future[None] | None = None
        self._expect_continue = expects_continue(head)
        self.body_complete = decoder is None
        self.too_large = False
        self.error: BadRequest | None = None
        self.started = False  # the response began (asked after the connection closed too)
        self.chunked = False
        self.bodyless = False
        # Once a response is chunked, the writer of whole chunks framed already (the engine's
        # own, as they came): the transport's own write, so that the relay's hot path makes no
        # call of ours per chunk. Chunks that end the body go by ``write_last``.
        self.write_chunks: Callable[[bytes], None] | None = None

    # -- the request ------------------------------------------------------------------------
    @property
    def refused(self) -> bool:
        """The body was cut short (too large, or broken framing): the connection cannot carry
        another request, since where this one ends is unknown or unread."""
        return self.too_large or self.error is not None

    def feed(self, data: bytes | None) -> bytes:
        """Body bytes off the wire, or None: the next share of the read the decoder left
        (``backlog``). Returns what follows the body (a pipelined request)."""
        if self.too_large or self.error is not None:  # (refused: read per read, no call)
            self.backlog = False
            return b""  # the rest of a refused body is never read as requests
        if data is not None:
            self._wire += len(data)
        return self._decode(data)

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

    async def read_start(self, budget: float, enough: Callable[[bytes, int], bool]) -> bytes:
        """The body whole: over HTTP/1.1 a body does not stream both ways (HTTP/2's
        ``H2Stream.read_start`` may hand back its start alone)."""
        return await self.read_body(budget)

    def follow(self, sink: Callable[[bytes, bool], None]) -> None:
        """Nothing follows a body read whole: its end at once."""
        sink(b"", True)

    # -- the response -----------------------------------------------------------------------
    def begin(
        self,
        status: int,
        reason: str,
        headers: Iterable[tuple[str, str]],
        length: int | None,
        *,
        close: bool = False,
        last: bool = False,
    ) -> None:
        """Write the response head: ``headers`` as given (no framing headers among them),
        then the framing: ``length`` bytes, else chunked (HTTP/1.1) or until close. The
        connection says whether it carries another request after it (not when ``close``)."""
        keep = self.keep_alive and not close
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{k}: {v}" for k, v in headers]  # (a list built in one frame: no generator)
        framing = response_framing(self.method, status, self.head.version, length)
        if framing is ResponseFraming.NONE:
            self.bodyless = True
            if length is not None and status != 204:
                lines.append(f"Content-Length: {length}")  # what a GET would have had
        elif framing is ResponseFraming.LENGTH:
            lines.append(f"Content-Length: {length}")
        elif framing is ResponseFraming.CHUNKED:
            lines.append("Transfer-Encoding: chunked")
            self.chunked = True
            self.write_chunks = self.transport.write
        else:
            keep = False  # HTTP/1.0 and no length: the body ends with the connection
        # the table's answer: a body not (wholly) read cannot be skipped to find the next
        # request, and a shutdown closes after this response
        if not self._conn.began(keep):
            lines.append("Connection: close")
        elif self.head.version < (1, 1):
            lines.append("Connection: keep-alive")
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

    def write_last(self, chunks: bytes) -> None:
        """Whole chunks, the last chunk among them (no trailer): the response's end."""
        self.transport.write(chunks)
        self._conn.ending()

    def end(self, trailers: list[tuple[str, str]] | None = None) -> None:
        """The end of the response (the last chunk, when chunked), unless written already
        (``write_last``) or the connection is closing. ``trailers`` (an HTTP/2 engine's) are
        not written: HTTP/1.1 clients do not ask for them, and gRPC is HTTP/2's alone;
        ``begin``'s ``last`` is HTTP/2's too."""
        if (
            self._conn.ending()
            and self.chunked
            and not self.bodyless
            and not self.transport.is_closing()
        ):
            self.transport.write(b"0\r\n\r\n")

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        *,
        close: bool = False,
    ) -> None:
        """A whole response the server produces itself (errors)."""
        headers = [("Content-Type", content_type), ("Date", formatdate(usegmt=True))]
        self.begin(status, reason_phrase(status), headers, len(body), close=close)
        self.write(body)
        self.end()

    def respond_error(
        self, status: int, message: str, *, close: bool = False, body: bytes | None = None
    ) -> None:
        """An error the sidecar answers itself: ``body`` in the request's API's shape (the
        relay's), else the OpenAI shape."""
        if body is None:
            body = openai_error_body(status, message)
        self.respond(status, body, close=close)

    def switch(self, head: bytes) -> tuple[asyncio.Transport, bytes]:
        """The engine switched protocols (101, a WebSocket): its ``head`` is written as it
        came, and the connection carries no more HTTP. Returns its transport, which the
        handler takes over, and what the client sent after its request."""
        self.started = True
        self._conn.began(False)
        self.transport.write(head)
        return self.transport, self._conn.switched()

    def _held(self) -> bool:
        return self._conn.writing is _PAUSED

    @property
    def closed(self) -> bool:
        """The client's connection is closed or closing: nothing written reaches it."""
        return self.transport.is_closing()

    def abort(self) -> None:
        """Close the connection now, without the response's clean end."""
        self._conn.close()
