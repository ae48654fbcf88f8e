"""One HTTP/2 stream as a handler sees a request: the surface of ``request.Request``, so that
the relay handles a stream as it handles a request over HTTP/1.1.

The body is buffered up to the limit and read whole (``read_body``), as over HTTP/1.1. The
response goes out through the connection (``H2ServerConnection``), which frames it, holds
what the client's flow-control windows do not admit yet, and tells the stream when that backlog
passes the high mark (``tell_paused``: the relay pauses the engine) and when it drains
(``tell_resumed``). The relay's whole HTTP/1.1 chunks (``write_chunks``) go on as their
payloads (``chunks.payloads``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Protocol

from llmobs.wire.h2.chunks import payloads
from llmobs.wire.http1 import RequestHead, content_length
from llmobs.wire.request import (
    BodyTooLarge,
    BodyTooSlow,
    Hooks,
    openai_error_body,
    reason_phrase,
)

PREFIX = 5  # the body's first bytes kept apart for ``read_start``: a gRPC message's prefix


class Carrier(Protocol):
    """What a stream needs of its connection (``connection.H2ServerConnection``)."""

    remote: str
    scheme: str
    closing: bool

    def send_head(
        self, stream: H2Stream, status: int, fields: Iterable[tuple[str, str]], length: int | None
    ) -> None: ...
    def send(self, stream: H2Stream, data: bytes, end: bool) -> None: ...
    def send_trailers(self, stream: H2Stream, fields: Iterable[tuple[str, str]]) -> None: ...
    def held(self, stream: H2Stream) -> bool: ...
    def reset(self, stream: H2Stream) -> None: ...


class H2Stream(Hooks):
    """A request on one stream of an HTTP/2 connection, and the writing of its response."""

    __slots__ = (
        "_conn",
        "_enough",
        "_limit",
        "_parts",
        "_prefix",
        "_received",
        "_sink",
        "_waiter",
        "body_complete",
        "bodyless",
        "content_length",
        "ended",
        "has_body",
        "head",
        "headers",
        "id",
        "path",
        "remote",
        "reset",
        "scheme",
        "started",
        "target",
        "too_large",
        "write_chunks",
    )

    def __init__(
        self,
        conn: Carrier,
        stream_id: int,
        head: RequestHead,
        limit: int,
        ended: bool,
    ) -> None:
        super().__init__()
        self._conn = conn
        self.id = stream_id
        self.head = head
        self.method = head.method
        self.target = head.target
        self.path = head.path
        self.headers = head.headers
        self.remote = conn.remote
        self.scheme = conn.scheme
        self.content_length = content_length(head.headers)
        self.has_body = not ended  # DATA frames to come (an empty body ends with its head)
        self.body_complete = ended
        self._limit = limit
        self._parts: list[bytes] = []
        self._received = 0
        self._waiter: asyncio.Future[None] | None = None
        self._enough: Callable[[bytes, int], bool] | None = None  # ``read_start``'s test
        self._prefix = b""  # the body's first bytes (up to 5: a gRPC message's prefix)
        self._sink: Callable[[bytes, bool], None] | None = None  # ``follow``'s
        self.too_large = False
        self.started = False  # the response's head was sent
        self.bodyless = False  # HEAD, 204, 304: a head alone
        self.ended = False  # the response's end was sent (or the stream reset)
        self.reset = False  # the stream is gone: reset by either side, or its connection
        self.write_chunks: Callable[[bytes], None] | None = None

    # -- the request ------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """A DATA frame's payload: kept up to the limit, past it dropped (a 413 follows); once
        followed (``follow``), passed on as it comes."""
        sink = self._sink
        if sink is not None:
            sink(data, False)
            return
        self._received += len(data)
        if self._received > self._limit:
            if not self.too_large:  # answered (413) at once, not after the rest
                self.too_large = True
                self._parts.clear()
                self.complete()
        elif data:
            self._parts.append(data)
            if len(self._prefix) < PREFIX:
                self._prefix += data[: PREFIX - len(self._prefix)]
            if self._enough is not None:
                self._check_start()

    def complete(self) -> None:
        """The client ended its half of the stream: the body is whole."""
        self.body_complete = True
        sink, self._sink = self._sink, None
        if sink is not None and not self.reset:
            sink(b"", True)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read_body(self, budget: float) -> bytes:
        """The whole body; ``BodyTooSlow`` after ``budget`` seconds, ``BodyTooLarge`` past
        the limit."""
        if not self.body_complete:
            await self._wait(budget)
        self._check()
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _wait(self, budget: float) -> None:
        """Until the body is whole, or enough of it (``read_start``); ``BodyTooSlow`` after
        ``budget`` seconds."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(budget):
                await self._waiter
        except TimeoutError:
            raise BodyTooSlow from None
        finally:
            self._waiter = self._enough = None

    def _check(self) -> None:
        """What ended the wait: the client reset the stream, or left, while it was sending;
        or the body passed the limit."""
        if self.reset:
            raise ConnectionResetError("the client reset the stream")
        if self.too_large:
            raise BodyTooLarge

    async def read_start(self, budget: float, enough: Callable[[bytes, int], bool]) -> bytes:
        """What the body holds once ``enough`` says it is enough, from its first bytes and
        how many have come (a gRPC stream's first message), or once it is whole, whichever
        comes first; the rest then goes on through ``follow``. ``BodyTooSlow`` after
        ``budget`` seconds, ``BodyTooLarge`` past the limit before it was enough. (Counts, not
        the bytes joined per frame: a client's tiny frames cost a test each, not a copy.)"""
        if not self.body_complete and not enough(self._prefix, self._received):
            self._enough = enough
            await self._wait(budget)
        self._check()
        start = b"".join(self._parts)
        self._parts = []
        return start

    def follow(self, sink: Callable[[bytes, bool], None]) -> None:
        """Hand the rest of the body to ``sink`` (``Tail``): what came since ``read_start``
        first, then each part as it comes, and its end. A body that passed the limit in the
        meantime has its stream reset (the engine's then ends: the client is gone)."""
        if self.too_large:
            self.abort()
            return
        parts, self._parts = self._parts, []
        if parts:
            sink(parts[0] if len(parts) == 1 else b"".join(parts), False)
        if not self.body_complete:
            self._sink = sink
        elif not self.reset:
            sink(b"", True)

    def _check_start(self) -> None:
        """``read_start``'s wait ends once the body holds enough."""
        enough, waiter = self._enough, self._waiter
        if (
            enough is not None
            and waiter is not None
            and not waiter.done()
            and enough(self._prefix, self._received)
        ):
            waiter.set_result(None)

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
        """The response's head (``last``: the whole response, as a gRPC "trailers-only"
        answer is); ``reason`` and ``close`` mean nothing on HTTP/2 (a stream ends alone)."""
        self.bodyless = last or self.method == "HEAD" or status in (204, 304) or 100 <= status < 200
        self.started = True
        self._conn.send_head(self, status, headers, length)
        if not self.bodyless:
            self.write_chunks = self._write_chunks

    def write(self, data: bytes) -> None:
        if data and not self.bodyless:
            self._conn.send(self, data, False)

    def _write_chunks(self, chunks: bytes) -> None:
        parts = payloads(chunks)[0]  # (one DATA frame for a read's chunks, not one each)
        if parts:
            self._conn.send(self, parts[0] if len(parts) == 1 else b"".join(parts), False)

    def write_last(self, chunks: bytes) -> None:
        """Whole chunks, the last among them: their payloads and the stream's end at once."""
        parts = payloads(chunks)[0]
        if not self.ended:
            self.ended = True
            self._conn.send(self, b"".join(parts), True)

    def end(self, trailers: list[tuple[str, str]] | None = None) -> None:
        """The response's end, with ``trailers`` if the engine sent some (gRPC's status)."""
        if not self.ended:
            self.ended = True
            if trailers:
                self._conn.send_trailers(self, trailers)
            else:
                self._conn.send(self, b"", True)

    def respond(
        self, status: int, body: bytes, content_type: str = "application/json", *,
        close: bool = False,
    ) -> None:  # fmt: skip
        """A whole response the server produces itself (errors)."""
        headers = [("Content-Type", content_type), ("Date", formatdate(usegmt=True))]
        self.begin(status, reason_phrase(status), headers, len(body))
        self.write(body)
        self.end()

    def respond_error(
        self, status: int, message: str, *, close: bool = False, body: bytes | None = None
    ) -> None:
        """An error the sidecar answers itself, in the request's API's shape or OpenAI's."""
        self.respond(status, body if body is not None else openai_error_body(status, message))

    # -- what the connection tells ----------------------------------------------------------
    def _held(self) -> bool:
        return self._conn.held(self)

    def tell_gone(self) -> None:
        """The stream was reset or its connection lost: its body's wait ends, and
        ``on_gone``'s callback is called, once."""
        self.reset = True
        self.complete()
        super().tell_gone()

    @property
    def closed(self) -> bool:
        """Nothing written reaches the client: the stream or its connection is gone."""
        return self.reset or self._conn.closing

    def abort(self) -> None:
        """End the stream uncleanly (RST_STREAM): a cut response, the connection kept."""
        self._conn.reset(self)
