"""The engine leg's connection: HTTP/1.1 to the engine at the protocol level, one exchange
at a time (``upstream.Upstream`` pools them).

Why not an HTTP client library: with one, each chunk the engine writes wakes a task that
reads it from a stream and awaits the write to the client: a future, a scheduler round and two
coroutine calls per token, the larger part of a Python relay's cost per chunk. Here the
response body is handed on inside ``data_received``: decoded (``http1``), written to the
client's transport and given to the observer in the same callback, as a C proxy would. So is
the response head: the handler's ``on_head`` callback runs in the read that completes it and
returns the body's callback (``OnBody``), so the head and a first chunk that came with it go
on to the client at once, not a loop iteration later. The request handler only waits for the
end.

The read timeout runs between reads, checked by one timer per connection rather than one per
chunk, and not while reads are held for a slow client (``flow.Reading``); no header is added
but ``Host`` and the body's framing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from llmobs.wire.flow import Reading
from llmobs.wire.habits import Habits
from llmobs.wire.http1 import (
    MAX_HEAD_BYTES,
    BodyDecoder,
    ChunkedBody,
    Frames,
    ProtocolError,
    ResponseHead,
    body_decoder,
    parse_response_head,
    reusable,
)
from llmobs.wire.states import ENGINE, EngineEvent, EngineState, compiled, illegal

# Called with each read of a response body: the payload of the read; the read itself when it
# was whole chunks of a chunked body (it can go on as it came, see
# ``http1.BodyDecoder.whole``), else None; and whether the read ended the body (a whole read
# then holds the last chunk too).
OnBody = Callable[[bytes, bytes | None, bool], None]
# Called with the exchange and the response head as soon as the head has come (inside
# ``data_received``); returns the body's callback.
OnHead = Callable[["Exchange", ResponseHead], OnBody]


class Tail(Protocol):
    """The rest of a request body still on its way (a gRPC stream's messages): ``follow``
    hands each part to ``sink`` as it comes, and ``(b"", True)`` at its end."""

    def follow(self, sink: Callable[[bytes, bool], None]) -> None: ...


class Exchange(Protocol):
    """What the relay uses of an exchange with the engine, whichever its protocol: HTTP/1.1
    (``Connection``) or HTTP/2 (``h2.client.H2Exchange``)."""

    head_ended: bool  # the head ended the response (HTTP/2: a gRPC "trailers-only" answer)
    trailers: list[tuple[str, str]] | None  # the engine's trailers (HTTP/2's), as they came

    @property
    def relaying(self) -> bool: ...
    @property
    def unanswered(self) -> bool: ...
    def send(self, method: str, head: bytes, body: bytes, on_head: OnHead) -> None: ...
    async def wait(self, read_timeout: float) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


# A read this large ends the connection's share of a loop turn (``flow.Reading.defer``): the
# observer's work grows with the payload, and uvloop reads a busy socket up to 32 times (of up
# to 256 KB) in one turn. Token streams never come near it.
YIELD_BYTES = 64 * 1024
MAX_INTERIM = 16  # 1xx heads skipped before a response, in one read (each is parsed)


_NEXT = compiled(ENGINE, EngineState, EngineEvent)
# the states and events by name, as module globals: the connection's dispatch reads them per read
_IDLE, _SENT, _ANSWERING = EngineState.IDLE, EngineState.SENT, EngineState.ANSWERING
_RELAYING, _RELAYING_LAST = EngineState.RELAYING, EngineState.RELAYING_LAST
_SPENT, _UNANSWERED, _CLOSED = EngineState.SPENT, EngineState.UNANSWERED, EngineState.CLOSED
_SEND, _PART, _HEAD, _HEAD_LAST = (
    EngineEvent.SEND, EngineEvent.PART, EngineEvent.HEAD, EngineEvent.HEAD_LAST
)  # fmt: skip
_END, _RETIRE, _LOST = EngineEvent.END, EngineEvent.RETIRE, EngineEvent.LOST


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
    """One connection to the upstream; carries one exchange at a time.

    Its ``state`` (``states.EngineState``) says what a read is: the response head (``SENT``,
    ``ANSWERING``), its body (``RELAYING``, ``RELAYING_LAST``), or a protocol error; and what
    follows the response (reuse or not). It moves by ``states.ENGINE``'s events only.
    """

    # Slots, not an instance dict: every read touches this object, and where reads come
    # between sleeps its memory is out of cache (docs/benchmarks.md, "fifth").
    # HTTP/2's alone (``h2.client.H2Exchange``): an answer that is its head, its trailers
    head_ended = False
    trailers: list[tuple[str, str]] | None = None

    __slots__ = (
        "_decoder",
        "_done",
        "_frames",
        "_habits",
        "_head_buf",
        "_loop",
        "_method",
        "_on_body",
        "_on_head",
        "_read_timeout",
        "_reading",
        "_timer",
        "_waiting",
        "idle_since",
        "last_read",
        "state",
        "streamed",
        "switched",
        "transport",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, frames: Frames, habits: Habits | None = None
    ) -> None:
        """``frames``, ``habits``: the pool's, what its connections learn of the engine."""
        self._loop = loop
        self.state = _IDLE
        self.transport: asyncio.Transport | None = None
        self._method = "GET"
        self._head_buf = b""
        self._on_head: OnHead | None = None  # set while a response head is awaited
        self._done: asyncio.Future[None] | None = None
        # the body's: set with the head (``RELAYING``), dropped when that state is left, so
        # that a read finds what it is for in one attribute
        self._decoder: BodyDecoder | None = None
        self._on_body: OnBody | None = None
        self._waiting = False  # the end of the response is awaited (under the read timeout)
        self._read_timeout = 0.0
        self._timer: asyncio.TimerHandle | None = None
        # reading: held for a slow client (the engine is not silent then), deferred while a
        # read is decoded a share per loop turn
        self._reading = Reading(loop)
        self.last_read = 0.0
        self.idle_since = 0.0  # when it went back to the pool (the response's last read)
        self._frames = frames  # the pool's: what chunked responses learnt of their framing
        self._habits = habits or Habits()
        self.streamed = False  # its last response was chunked (``habits``)
        self.switched = b""  # after a 101: what the engine sent after its head

    @property
    def relaying(self) -> bool:
        """A response is on its way: its head has come, its body has not ended or failed."""
        return self.state is _RELAYING or self.state is _RELAYING_LAST

    @property
    def reusable(self) -> bool:
        """It may carry another request: no exchange on, and the last left it fit."""
        return self.state is _IDLE

    @property
    def closed(self) -> bool:
        """The transport is gone."""
        return self.state >= _UNANSWERED

    @property
    def unanswered(self) -> bool:
        """The engine closed the connection with the request sent and no byte of its response
        come: it may never have read it (a pooled connection it closed meanwhile), so an
        idempotent request may go again."""
        return self.state is _UNANSWERED

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach(transport)  # type: ignore[arg-type]  # a TCP (or TLS) transport

    def attach(self, transport: asyncio.Transport) -> None:
        """The connection's transport (``connection_made``, or the pool's when uvloop calls
        that after ``create_connection`` returned)."""
        self.transport = self._reading.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_read = self._loop.time()
        decoder = self._decoder
        if decoder is not None:  # relaying
            try:
                payload = decoder.feed(data)
            except ProtocolError as exc:
                self._fail(exc)
                return
            if payload:
                on_body = self._on_body
                if on_body is not None:
                    on_body(payload, data if decoder.whole else None, decoder.done)
            if decoder.done:
                self._finish(decoder)
            elif decoder.backlog or len(data) >= YIELD_BYTES:
                self._reading.defer(self._body_share)
        elif self.state is _SENT or self.state is _ANSWERING:
            self._read_head(data)
        else:
            self._fail(ProtocolError("data from the upstream while no request was pending"))

    def eof_received(self) -> bool:
        decoder = self._decoder
        if decoder is not None and not decoder.done and decoder.eof():
            self._finish(decoder)  # (read until close: its head forbade reuse)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._decoder = None
        if self.state is _IDLE or self.state is _SENT:  # pooled, or taken and unanswered
            self._habits.closed(self.streamed, self._loop.time() - self.idle_since)
        self._go(_LOST)
        self._stop_timer()
        self._reading.stop()
        error = UpstreamClosed("upstream closed the connection")
        if exc is not None:
            error.__cause__ = exc
        self._end(error)

    # -- states -----------------------------------------------------------------------------
    def _go(self, event: EngineEvent) -> bool:
        """Move by ``event`` (``states.ENGINE``); an illegal one is a bug: reported
        (``states.illegal``), and the exchange failed with it (its stream's alone), the
        connection aborted."""
        after = _NEXT[self.state][event]
        if after is not None:
            self.state = after
            return True
        self._fail(illegal("engine", self.state, event))
        return False

    # -- fairness: one share of work per loop turn ----------------------------------------
    def _body_share(self) -> bool:
        """The next share of the read the decoder left (``Reading``'s work, in the next
        turn): True while more is left. With reading deferred, the engine's EOF or reset is
        seen only once the rest is decoded, so a body it ended before closing still ends
        cleanly."""
        decoder = self._decoder
        if decoder is None or not decoder.backlog:
            return False
        self.last_read = self._loop.time()
        try:  # never whole: the read as it came was not all of this share
            payload = decoder.resume()
        except ProtocolError as exc:
            self._fail(exc)
            return False
        if payload:
            on_body = self._on_body
            if on_body is not None:
                on_body(payload, None, decoder.done)
        if decoder.done:
            self._finish(decoder)
        return self._decoder is decoder and decoder.backlog

    # -- the exchange -----------------------------------------------------------------------
    def _read_head(self, data: bytes) -> None:
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
                self._go(_PART)  # (a retry now would repeat the request)
                return
            try:
                head = parse_response_head(buf[:end])
            except ProtocolError as exc:
                self._fail(exc)
                return
            buf = buf[end + 4 :]
            if 100 <= head.status < 200 and head.status != 101:
                interim += 1  # an interim response (100 Continue, 103 Early Hints): skipped
                if interim == 1:
                    self._go(_PART)
                if interim > MAX_INTERIM:
                    self._fail(ProtocolError("too many interim responses"))
                    return
                continue
            break
        self._head_buf = b""
        if head.status == 101:
            self._switch(head, buf)
            return
        self._start_body(head, buf)

    def _switch(self, head: ResponseHead, rest: bytes) -> None:
        """101 Switching Protocols: the connection is no longer HTTP's. Spent (never pooled
        again), its transport the handler's from ``on_head`` on, with what came after the
        head (``switched``); the exchange ends here."""
        on_head, self._on_head = self._on_head, None
        assert on_head is not None
        self._retire()
        self._stop_timer()
        self.switched = rest
        if self.transport is not None:  # nothing more read until the handler takes it over
            self.transport.pause_reading()
        try:
            on_head(self, head)
        except Exception as exc:  # the handler's failure: it gets it back from wait()
            self._end(exc)
            if self.transport is not None:
                self.transport.abort()
            return
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _start_body(self, head: ResponseHead, buf: bytes) -> None:
        """The response head came: its body is relayed from ``buf`` (what came after it) on."""
        try:
            decoder = body_decoder(head, self._method, self._frames)
        except ProtocolError as exc:
            self._fail(exc)
            return
        self._decoder = decoder
        on_head, self._on_head = self._on_head, None
        assert on_head is not None
        if not self._go(_HEAD if reusable(head, decoder) else _HEAD_LAST):
            return
        try:
            self._on_body = on_head(self, head)
        except Exception as exc:  # the handler's failure: it gets it back from wait()
            self._fail(exc)
            return
        if buf:
            self.data_received(buf)
        elif decoder.done:
            self._finish(decoder)

    def _finish(self, decoder: BodyDecoder) -> None:
        """The response ended: the connection may carry another request unless the head
        forbade it (the state says), bytes came after the response, or the request is not
        wholly sent."""
        transport = self.transport
        unfit = decoder.extra or (transport is not None and transport.get_write_buffer_size())
        streamed = self.streamed = type(decoder) is ChunkedBody
        if streamed and self._habits.closes_after_stream:  # the engine closes it: unfit
            unfit = True
        self._decoder = None
        self._go(_RETIRE if unfit else _END)
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _retire(self) -> None:
        """No more exchanges on this connection (and nothing more of this one relayed)."""
        self._decoder = None
        self._go(_RETIRE)

    def _fail(self, exc: Exception) -> None:
        self._retire()
        self._end(exc)
        if self.transport is not None:
            self.transport.abort()

    def _end(self, exc: Exception) -> None:
        """The exchange fails with ``exc`` (``wait`` raises it), if it has not ended: nothing
        more goes to the handler, whose stream and this connection then hold each other no
        longer (no cycle left behind)."""
        self._on_head = self._on_body = None
        future = self._done
        if future is not None and not future.done():
            _fail_future(future, exc)

    def send(self, method: str, head: bytes, body: bytes, on_head: OnHead) -> None:
        """Write a request. ``on_head`` gets its response head when it comes (it returns the
        body's callback); the end of the response is awaited with ``wait()``.

        The body is in the transport's buffer at once (it is in memory already), and the wait
        for the response starts while it drains: an engine may answer before it has read the
        whole body (a 413, say), and that answer is the exchange's result. A connection whose
        request is not wholly sent when its response ends is not reused (``_finish``).
        """
        transport = self.transport
        assert transport is not None
        # spent or closed: the pool's race with the engine's close; an exchange on: a bug
        if self.state >= _SPENT or transport.is_closing() or not self._go(_SEND):
            raise UpstreamClosed("upstream closed the connection")
        self._method = method
        self._on_head = on_head
        self._done = self._loop.create_future()
        self._on_body = None
        self.last_read = self._loop.time()
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
            self._on_body = None  # the stream holds this connection: no cycle left behind

    def _check(self) -> None:
        """The read-timeout timer: fail the awaited future, or re-arm from the last read."""
        self._timer = None
        if not self._waiting or self._done is None:
            return  # no wait on: lapse (the next wait arms a timer)
        if self._reading.held:  # not reading: the client's send timeout bounds this, not ours
            self._timer = self._loop.call_at(self._loop.time() + self._read_timeout, self._check)
        elif self._loop.time() - self.last_read >= self._read_timeout:
            self._retire()
            self._end(UpstreamTimeout("upstream read timed out"))  # a head now is too late
        else:
            self._timer = self._loop.call_at(self.last_read + self._read_timeout, self._check)

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def pause_reading(self) -> None:
        """Stop reading (a slow client's buffer is full); the read timeout stops with it."""
        self._reading.hold()

    def resume_reading(self) -> None:
        """Read again; the engine's silence is counted from now. A read left part decoded
        is taken up first, in the next loop turn."""
        reading = self._reading
        if reading.held:
            self.last_read = self._loop.time()
            reading.release()
        elif reading.deferred:
            reading.release()

    def close(self) -> None:
        """Close the connection; at once if a request is not wholly sent (a graceful close
        would wait for an engine that may never read it, and hold the socket until then)."""
        self._retire()
        self._on_head = self._on_body = None  # nothing more is relayed; no cycle outlives it
        self._reading.stop()
        if not self._waiting:  # else the read timeout still bounds the wait
            self._stop_timer()
        transport = self.transport
        if transport is not None:
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()
