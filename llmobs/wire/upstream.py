"""The upstream leg: HTTP/1.1 to the engine at the protocol level, pooled connections.

Why not an HTTP client library: with one, each chunk the engine writes wakes a task that
reads it from a stream and awaits the write to the client: a future, a scheduler round and two
coroutine calls per token, the larger part of a Python relay's cost per chunk. Here the
response body is handed on inside ``data_received``: decoded (``http1``), written to the
client's transport and given to the observer in the same callback, as a C proxy would. So is
the response head: the handler's ``on_head`` callback runs in the read that completes it and
returns the sink for the body, so the head and a first chunk that came with it go on to the
client at once, not a loop iteration later. The request handler only waits for the end.

What it does, as a reverse proxy's upstream leg should: one request per connection at a time,
idle connections kept for reuse (LIFO, bounded) unless the response forbids it; a connection
that went stale in the pool is never used; connect and read timeouts (the read timeout runs
between reads, checked by one timer per connection rather than one per chunk, and not while
reads are paused); the body relayed as it comes with back-pressure from a slow client (upstream
reads pause until the client's buffer drains); no header added but ``Host`` and the body's
framing.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from llmobs.wire.http1 import (
    MAX_HEAD_BYTES,
    BodyDecoder,
    Frames,
    ProtocolError,
    ResponseHead,
    body_decoder,
    parse_response_head,
    reusable,
)

# A body's sink: the payload of a read; the read itself when it was whole chunks of a chunked
# body (it can go on as it came, see ``http1.BodyDecoder.whole``), else None; and whether the
# read ended the body (a whole read then holds the last chunk too).
Sink = Callable[[bytes, bytes | None, bool], None]
# Called with the connection and the response head as soon as the head has come (inside
# ``data_received``); returns the sink for the body.
OnHead = Callable[["Connection", ResponseHead], Sink]

# Idle connections kept for reuse. Streams of a batch end together: a pool smaller than the
# concurrency closes the surplus at once, and the next requests then open as many new
# connections in one burst (512 streams against a 256 pool: a SYN backlog overflow at the
# engine, 1 s added to TTFT at p99). An idle connection costs an fd and ~3 KiB.
MAX_IDLE = 4096
# A read this large ends the connection's share of a loop turn (``Connection._yield``): the
# observer's work grows with the payload, and uvloop reads a busy socket up to 32 times (of up
# to 256 KB) in one turn. Token streams never come near it.
YIELD_BYTES = 64 * 1024
MAX_INTERIM = 16  # 1xx heads skipped before a response, in one read (each is parsed)


def _fail_future(future: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``future``, marked as retrieved: a request that ended early never awaits its
    ``done`` future, and asyncio would log the exception as lost (awaiting still raises)."""
    future.set_exception(exc)
    future.exception()


class UpstreamClosed(ConnectionResetError):
    """The upstream closed the connection before the response ended."""


class UpstreamTimeout(TimeoutError):
    """The upstream stayed silent longer than the read timeout, or did not accept in time."""


class Connection(asyncio.Protocol):
    """One connection to the upstream; carries one exchange at a time."""

    # Slots, not an instance dict: every read touches this object, and where reads come
    # between sleeps its memory is out of cache (docs/benchmarks.md, "fifth").
    __slots__ = (
        "_decoder",
        "_deferred",
        "_done",
        "_frames",
        "_head_buf",
        "_loop",
        "_method",
        "_on_head",
        "_paused",
        "_read_timeout",
        "_sink",
        "_timer",
        "_turn",
        "_waiting",
        "closed",
        "idle_since",
        "last_read",
        "responded",
        "reusable",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, frames: Frames) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._method = "GET"
        self._head_buf = b""
        self._on_head: OnHead | None = None  # set while a response head is awaited
        self._done: asyncio.Future[None] | None = None
        self._decoder: BodyDecoder | None = None
        self._sink: Sink | None = None
        self._waiting = False  # the end of the response is awaited (under the read timeout)
        self.responded = False  # a byte of the response came (a retry would repeat the request)
        self._read_timeout = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False  # reads paused for a slow client: the engine is not silent
        self._deferred = False  # reads paused until the next loop turn (``_yield``)
        self._turn: asyncio.Handle | None = None  # that next turn, when scheduled
        self.last_read = 0.0
        self.idle_since = 0.0  # when it went back to the pool (the response's last read)
        self._frames = frames  # the pool's: what chunked responses learnt of their framing

    @property
    def relaying(self) -> bool:
        """A response is on its way: its head has come, its body has not ended or failed."""
        return self._decoder is not None

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP (or TLS) transport

    def data_received(self, data: bytes) -> None:
        self.last_read = self._loop.time()
        decoder = self._decoder
        if decoder is not None:
            try:
                payload = decoder.feed(data)
            except ProtocolError as exc:
                self._fail(exc)
                return
            if payload:
                sink = self._sink
                if sink is not None:
                    sink(payload, data if decoder.whole else None, decoder.done)
            if decoder.done:
                self._finish(decoder)
            elif decoder.backlog or len(data) >= YIELD_BYTES:
                self._yield()
            return
        if self._on_head is None:
            self._fail(ProtocolError("data from the upstream while no request was pending"))
            return
        self._read_head(data)

    def eof_received(self) -> bool:
        decoder = self._decoder
        if decoder is not None and not decoder.done and decoder.eof():
            self.reusable = False
            self._finish(decoder)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self._stop_turn()
        error = UpstreamClosed("upstream closed the connection")
        if exc is not None:
            error.__cause__ = exc
        self._end(error)

    # -- fairness: one share of work per loop turn ----------------------------------------
    def _yield(self) -> None:
        """This connection had its share of this loop turn (a read of more framing than the
        decoder's budget, or a large one): stop reading, and go on in the next turn, after
        the other connections' reads. Under uvloop a socket is otherwise read up to 32 times
        in one turn. With reading paused, the engine's EOF or reset is seen only once the
        rest is decoded, so a body it ended before closing still ends cleanly."""
        self._deferred = True
        transport = self.transport
        if transport is not None and not self.closed:
            transport.pause_reading()
        if self._turn is None and not self._paused:
            self._turn = self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """The next share: the rest of the read the decoder left, then reading again."""
        self._turn = None
        decoder = self._decoder
        if self._paused:
            return  # a slow client: ``resume_reading`` takes it up
        if decoder is not None and decoder.backlog:
            self.last_read = self._loop.time()
            self._relay_rest(decoder)
            if self._decoder is decoder and decoder.backlog:
                self._turn = self._loop.call_soon(self._next_turn)
                return
        self._deferred = False
        transport = self.transport
        if transport is not None and not self.closed:
            transport.resume_reading()

    def _relay_rest(self, decoder: BodyDecoder) -> None:
        """Decode and hand on a share of what the decoder left of a read (never whole: the
        read as it came was not all of this share)."""
        try:
            payload = decoder.resume()
        except ProtocolError as exc:
            self._fail(exc)
            return
        if payload:
            sink = self._sink
            if sink is not None:
                sink(payload, None, decoder.done)
        if decoder.done:
            self._finish(decoder)

    def _stop_turn(self) -> None:
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.cancel()

    # -- the exchange -----------------------------------------------------------------------
    def _read_head(self, data: bytes) -> None:
        self.responded = True
        buf = self._head_buf + data
        interim = 0
        while True:
            end = buf.find(b"\r\n\r\n")
            # the limit holds whether the head came in one read or many
            if end > MAX_HEAD_BYTES or (end < 0 and len(buf) > MAX_HEAD_BYTES + 3):
                self._fail(ProtocolError("response head too large"))
                return
            if end < 0:
                self._head_buf = buf
                return
            try:
                head = parse_response_head(buf[:end])
            except ProtocolError as exc:
                self._fail(exc)
                return
            buf = buf[end + 4 :]
            if 100 <= head.status < 200 and head.status != 101:
                interim += 1  # an interim response (100 Continue, 103 Early Hints): skipped
                if interim > MAX_INTERIM:
                    self._fail(ProtocolError("too many interim responses"))
                    return
                continue
            break
        self._head_buf = b""
        try:
            decoder = body_decoder(head, self._method, self._frames)
        except ProtocolError as exc:
            self._fail(exc)
            return
        self.reusable = reusable(head, decoder)
        self._decoder = decoder
        on_head, self._on_head = self._on_head, None
        assert on_head is not None
        try:
            self._sink = on_head(self, head)
        except Exception as exc:  # the handler's failure: it gets it back from wait()
            self._fail(exc)
            return
        if buf:
            self.data_received(buf)
        elif decoder.done:
            self._finish(decoder)

    def _finish(self, decoder: BodyDecoder) -> None:
        transport = self.transport
        if decoder.extra or (transport is not None and transport.get_write_buffer_size()):
            self.reusable = False  # bytes after the response, or a request not wholly sent
        self._decoder = None
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self._decoder = None
        self._end(exc)
        if self.transport is not None:
            self.transport.abort()

    def _end(self, exc: Exception) -> None:
        """The exchange fails with ``exc`` (``wait`` raises it), if it has not ended: nothing
        more goes to the handler, whose stream and this connection then hold each other no
        longer (no cycle left behind), and the connection is not reused."""
        self.reusable = False
        self._on_head = self._sink = None
        future = self._done
        if future is not None and not future.done():
            _fail_future(future, exc)

    def send(self, method: str, head: bytes, body: bytes, on_head: OnHead) -> None:
        """Write a request. ``on_head`` gets its response head when it comes (it returns the
        sink for the body); the end of the response is awaited with ``wait()``.

        The body is in the transport's buffer at once (it is in memory already), and the wait
        for the response starts while it drains: an engine may answer before it has read the
        whole body (a 413, say), and that answer is the exchange's result. A connection whose
        request is not wholly sent when its response ends is not reused (``_finish``).
        """
        transport = self.transport
        assert transport is not None
        if self.closed or transport.is_closing():
            raise UpstreamClosed("upstream closed the connection")
        self._method = method
        self._on_head = on_head
        self._done = self._loop.create_future()
        self._sink = None
        self.responded = False
        self.last_read = self._loop.time()
        self.reusable = False
        if body:
            transport.writelines((head, body))
        else:
            transport.write(head)

    async def wait(self, read_timeout: float) -> None:
        """Wait for the end of the response: its head (``UpstreamTimeout`` when none comes
        within ``read_timeout``), then its body, with the read timeout between reads.

        One timer per connection, not one per wait: it is armed when a wait starts and none
        is pending, and when it fires it re-arms from the last read while a wait is on (or
        lapses when none is). A connection that carries request after request thus arms a
        timer about once per ``read_timeout``, not once per request. The state is in
        attributes, not a closure (a closure holding its own timer is a reference cycle per
        request); the pending timer's reference to the connection is dropped on close.
        """
        future = self._done
        assert future is not None
        self._waiting = True
        self._read_timeout = read_timeout
        deadline = self.last_read + read_timeout
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._check)
        try:
            await future
        finally:
            self._waiting = False
            self._sink = None  # the stream holds this connection: no cycle left behind

    def _check(self) -> None:
        """The read-timeout timer: fail the awaited future, or re-arm from the last read."""
        self._timer = None
        future = self._done
        if not self._waiting or future is None:
            return  # no wait on: lapse (the next wait arms a timer)
        if self._paused:  # not reading: the client's send timeout bounds this, not ours
            self._timer = self._loop.call_at(self._loop.time() + self._read_timeout, self._check)
        elif self._loop.time() - self.last_read >= self._read_timeout:
            self._end(UpstreamTimeout("upstream read timed out"))  # a head now is too late
        else:
            self._timer = self._loop.call_at(self.last_read + self._read_timeout, self._check)

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def pause_reading(self) -> None:
        """Stop reading (a slow client's buffer is full); the read timeout stops with it."""
        self._paused = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read again; the engine's silence is counted from now. A read left part decoded
        (``_yield``) is taken up first, in the next loop turn."""
        if self._paused:
            self._paused = False
            self.last_read = self._loop.time()
        if self._deferred:
            if self._turn is None:
                self._turn = self._loop.call_soon(self._next_turn)
        elif self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        """Close the connection; at once if a request is not wholly sent (a graceful close
        would wait for an engine that may never read it, and hold the socket until then)."""
        self.reusable = False
        self._on_head = self._sink = None  # nothing more is relayed; no cycle outlives it
        self._stop_turn()
        if not self._waiting:  # else the read timeout still bounds the wait
            self._stop_timer()
        transport = self.transport
        if transport is not None:
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()


class Upstream:
    """The engine's address and a pool of idle connections to it."""

    def __init__(self, base_url: str, connect_timeout: float, idle_timeout: float) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        default = (443 if self.https else 80) == self.port and parts.port is None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self._connect_timeout = connect_timeout
        # An engine closes a connection idle for its keep-alive timeout (uvicorn, llama.cpp:
        # 5 s); one reused just then fails, and a POST may not be sent again (RFC 9110
        # 9.2.2): a pooled connection is therefore given up well before.
        self._idle_timeout = idle_timeout
        # one-chunk read lengths the connections' chunked responses have seen (http1.Frames):
        # pure, so shared by all, and bounded (256 lengths, ~60 KiB) for the whole pool
        self._frames: Frames = {}
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.https else None
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()
        # the loop its connections live on, taken at the first acquire: on CPython 3.11
        # asyncio.get_running_loop() makes a getpid system call, once a request otherwise
        self._loop: asyncio.AbstractEventLoop | None = None

    async def acquire(self) -> tuple[Connection, bool]:
        """A connection: a pooled one when there is a live one, else a new one.

        Returns it and whether it was reused (a reused one may have been closed by the
        engine an instant ago; the caller may retry such a failure once).
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        oldest = loop.time() - self._idle_timeout
        while self._idle:
            conn = self._idle.pop()  # the most recent first: the rest are older still
            if conn.idle_since < oldest:
                for stale in (conn, *self._idle):
                    stale.close()
                self._idle.clear()
                break
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                self._busy.add(conn)
                return conn, True
        try:
            async with asyncio.timeout(self._connect_timeout):
                transport, conn = await loop.create_connection(
                    lambda: Connection(loop, self._frames),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except TimeoutError:
            raise UpstreamTimeout("upstream connect timed out") from None
        if conn.transport is None:  # uvloop may call connection_made after returning
            conn.transport = transport
        self._busy.add(conn)
        return conn, False

    def release(self, conn: Connection) -> None:
        """Back to the pool if it may carry another request, else closed."""
        self._busy.discard(conn)
        idle = self._idle
        if len(idle) >= MAX_IDLE:  # drop those the engine closed meanwhile, then check
            idle[:] = [c for c in idle if not c.closed]
        if conn.reusable and not conn.closed and len(idle) < MAX_IDLE:
            conn.resume_reading()
            conn.idle_since = conn.last_read
            self._idle.append(conn)
        else:
            conn.close()

    def discard(self, conn: Connection) -> None:
        """Close a connection whose exchange did not end cleanly."""
        self._busy.discard(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection, idle or in use."""
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()

    def request_head(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes | None
    ) -> bytes:
        """The request line and headers: the client's (already filtered), ``Host``, framing."""
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines.extend(f"{k}: {v}" for k, v in headers)
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")
