"""The engine leg over HTTP/2 (``wire/h2/client.py``) against a scripted engine: the ``h2``
package's own server state machine on a loopback socket, each test's ``answer`` deciding what
the engine does with a stream. The head read back into a header block, the response's head
and body, a body larger than the window waiting for it, a paused stream's window kept shut,
a reset and a GOAWAY as failures (the latter: never processed), the read timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from h2.errors import ErrorCodes

from llmobs.wire.connection import UpstreamClosed, UpstreamTimeout
from llmobs.wire.h2.client import MAX_UNSENT, STREAM_WINDOW, H2Exchange, H2Upstream
from llmobs.wire.http1 import ResponseHead
from tests.support.servers import eventually

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: engine:8000\r\nX-Request-Id: r1\r\n"
HEAD += b"Connection: keep-alive\r\nContent-Length: %d\r\n\r\n"


@dataclass
class Engine:
    """A scripted HTTP/2 engine: what it was sent, and ``answer`` for each request's end."""

    answer: Callable[[Engine, int], None]
    headers: dict[int, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    bodies: dict[int, bytes] = field(default_factory=dict)
    windows: list[int] = field(default_factory=list)
    conn: h2.connection.H2Connection = field(
        default_factory=lambda: h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
    )
    writer: asyncio.StreamWriter | None = None
    port: int = 0

    def respond(self, stream_id: int, body: bytes, end: bool = True) -> None:
        self.conn.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"text/x")])
        for at in range(0, len(body), 16384):  # the frame size the client allows
            self.conn.send_data(stream_id, body[at : at + 16384])
        if end:
            self.conn.end_stream(stream_id)
        self.flush()

    def flush(self) -> None:
        assert self.writer is not None
        self.writer.write(self.conn.data_to_send())

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.conn.initiate_connection()
        self.flush()
        try:
            while data := await reader.read(65536):
                for event in self.conn.receive_data(data):
                    self.event(event)
                self.flush()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def event(self, event: Any) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self.headers[event.stream_id] = list(event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            sid = event.stream_id
            self.bodies[sid] = self.bodies.get(sid, b"") + (event.data or b"")
            self.conn.acknowledge_received_data(event.flow_controlled_length or 0, sid)
        elif isinstance(event, h2.events.StreamEnded):
            self.answer(self, event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated):
            self.windows.append(event.delta or 0)


@pytest.fixture
async def engine() -> AsyncIterator[Callable[[Callable[[Engine, int], None]], Any]]:
    servers = []
    engines: list[Engine] = []

    async def start(answer: Callable[[Engine, int], None]) -> tuple[Engine, H2Upstream]:
        scripted = Engine(answer)
        engines.append(scripted)
        server = await asyncio.start_server(scripted.serve, "127.0.0.1", 0)
        servers.append(server)
        scripted.port = server.sockets[0].getsockname()[1]
        return scripted, H2Upstream("127.0.0.1", scripted.port, "engine:8000", 5.0)

    yield start
    for scripted in engines:
        if scripted.writer is not None:
            scripted.writer.close()
    for server in servers:
        server.close()
        await server.wait_closed()


class Seen:
    """What the relay would be told of an exchange."""

    def __init__(self) -> None:
        self.head: ResponseHead | None = None
        self.body = b""
        self.last = False

    def on_head(self, conn: Any, head: ResponseHead) -> Callable[[bytes, bytes | None, bool], None]:
        self.head = head
        return self.on_body

    def on_body(self, data: bytes, frame: bytes | None, last: bool) -> None:
        self.body += data
        self.last = self.last or last


async def _exchange(upstream: H2Upstream, body: bytes = b"{}") -> tuple[H2Exchange, Seen]:
    exchange, _ = await upstream.acquire()
    seen = Seen()
    exchange.send("POST", HEAD % len(body), body, seen.on_head)
    return exchange, seen


async def test_a_request_and_its_response(engine: Any) -> None:
    scripted, upstream = await engine(lambda e, sid: e.respond(sid, b"hello"))
    exchange, seen = await _exchange(upstream)
    await exchange.wait(5.0)
    assert seen.head is not None and seen.head.status == 200 and seen.head.reason == "OK"
    assert seen.head.headers["content-type"] == "text/x"
    assert (seen.body, seen.last) == (b"hello", True)
    (block,) = scripted.headers.values()
    assert block[:4] == [(b":method", b"POST"), (b":scheme", b"http"),
                         (b":authority", b"engine:8000"),
                         (b":path", b"/v1/chat/completions")]  # fmt: skip
    assert (b"x-request-id", b"r1") in block
    assert not any(name in (b"host", b"connection") for name, _ in block)
    assert list(scripted.bodies.values()) == [b"{}"]
    upstream.close()


async def test_streams_share_one_connection(engine: Any) -> None:
    _, upstream = await engine(lambda e, sid: e.respond(sid, b"x"))
    pairs = [await _exchange(upstream) for _ in range(5)]
    await asyncio.gather(*(exchange.wait(5.0) for exchange, _ in pairs))
    assert [exchange.stream_id for exchange, _ in pairs] == [1, 3, 5, 7, 9]
    assert len({id(exchange.transport) for exchange, _ in pairs}) == 1
    upstream.close()


async def test_a_body_larger_than_the_window_waits_for_it(engine: Any) -> None:
    scripted, upstream = await engine(lambda e, sid: e.respond(sid, b"ok"))
    body = bytes(200_000)  # the engine's default window is 65,535 bytes
    exchange, seen = await _exchange(upstream, body)
    await exchange.wait(5.0)
    assert list(scripted.bodies.values()) == [body] and seen.body == b"ok"
    upstream.close()


async def test_a_paused_stream_is_not_credited_until_resumed(engine: Any) -> None:
    """(``h2`` sends a stream's WINDOW_UPDATE once half its window was credited: more than
    that is sent here, so that crediting shows.)"""
    scripted, upstream = await engine(lambda e, sid: None)
    paused, seen = await _exchange(upstream)
    flowing, _ = await _exchange(upstream)
    await eventually(lambda: len(scripted.headers) == 2)
    paused.pause_reading()
    first, second = scripted.headers
    much = STREAM_WINDOW * 3 // 5
    for sid in (first, second):
        scripted.respond(sid, bytes(much), end=False)
    window = scripted.conn.local_flow_control_window
    await eventually(lambda: len(seen.body) == much and window(second) > STREAM_WINDOW - much)
    assert len(seen.body) == much  # relayed, but its window stays shut
    assert scripted.conn.local_flow_control_window(first) == STREAM_WINDOW - much
    assert scripted.conn.local_flow_control_window(second) > STREAM_WINDOW - much  # it flows
    paused.resume_reading()
    await eventually(lambda: window(first) > STREAM_WINDOW - much)
    for exchange in (paused, flowing):
        exchange.close()
    upstream.close()


async def test_a_reset_fails_the_exchange(engine: Any) -> None:
    def reset(e: Engine, sid: int) -> None:
        e.conn.reset_stream(sid, ErrorCodes.INTERNAL_ERROR)
        e.flush()

    _, upstream = await engine(reset)
    exchange, _ = await _exchange(upstream)
    with pytest.raises(UpstreamClosed):
        await exchange.wait(5.0)
    assert exchange.unanswered
    upstream.close()


async def test_goaway_fails_what_it_never_processed_and_takes_no_new_stream(engine: Any) -> None:
    def goaway(e: Engine, sid: int) -> None:
        e.conn.close_connection(last_stream_id=0)
        e.flush()

    _, upstream = await engine(goaway)
    exchange, _ = await _exchange(upstream)
    with pytest.raises(UpstreamClosed):
        await exchange.wait(5.0)
    assert exchange.unanswered  # never processed: an idempotent request may go again
    again, reused = await upstream.acquire()
    assert not reused and again.transport is not exchange.transport
    upstream.close()


async def test_silence_is_a_read_timeout_and_cancels_the_stream(engine: Any) -> None:
    scripted, upstream = await engine(lambda e, sid: None)
    exchange, _ = await _exchange(upstream)
    with pytest.raises(UpstreamTimeout):
        await exchange.wait(0.2)
    (sid,) = scripted.headers
    await eventually(
        lambda: scripted.conn.streams.get(sid) is None or scripted.conn.streams[sid].closed
    )
    upstream.close()


async def test_an_engine_gone_fails_every_exchange(engine: Any) -> None:
    def leave(e: Engine, sid: int) -> None:
        assert e.writer is not None
        e.writer.transport.abort()

    _, upstream = await engine(leave)
    exchange, _ = await _exchange(upstream)
    with pytest.raises(UpstreamClosed):
        await exchange.wait(5.0)
    upstream.close()


# -- gRPC: a body that streams on, the engine's trailers, an answer that is its head ---------
GRPC_HEAD = (
    b"POST /vllm.grpc.engine.VllmEngine/Generate HTTP/1.1\r\nHost: engine:8000\r\n"
    b"Content-Type: application/grpc\r\nte: trailers\r\nConnection: keep-alive\r\n\r\n"
)


class Tail:
    """The rest of a body, as the relay's request hands it on (``wire.connection.Tail``)."""

    def __init__(self) -> None:
        self.sink: Callable[[bytes, bool], None] | None = None

    def follow(self, sink: Callable[[bytes, bool], None]) -> None:
        self.sink = sink


def _grpc_answer(e: Engine, sid: int) -> None:
    e.conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    e.conn.send_data(sid, b"\x00\x00\x00\x00\x01x")
    e.conn.send_headers(sid, [(b"grpc-status", b"0"), (b"grpc-message", b"")], end_stream=True)


async def test_a_streamed_body_follows_its_start_and_the_trailers_are_kept(engine: Any) -> None:
    scripted, upstream = await engine(_grpc_answer)
    exchange, _ = await upstream.acquire()
    seen, tail = Seen(), Tail()
    exchange.send("POST", GRPC_HEAD, b"\x00\x00\x00\x00\x02ab", seen.on_head, tail)
    assert tail.sink is not None and exchange.body_open
    await asyncio.sleep(0.05)
    assert not scripted.bodies or list(scripted.bodies.values()) == [b"\x00\x00\x00\x00\x02ab"]
    tail.sink(b"\x00\x00\x00\x00\x01c", False)
    tail.sink(b"", True)  # the client's end came as an empty DATA frame
    await exchange.wait(5.0)
    assert list(scripted.bodies.values()) == [b"\x00\x00\x00\x00\x02ab\x00\x00\x00\x00\x01c"]
    (block,) = scripted.headers.values()
    assert (b"te", b"trailers") in block  # HTTP/2 allows it; gRPC servers require it
    assert (seen.body, exchange.trailers) == (b"\x00\x00\x00\x00\x01x", [
        ("grpc-status", "0"), ("grpc-message", "")])  # fmt: skip
    assert not exchange.head_ended
    upstream.close()


async def test_an_answer_that_is_its_head_alone_is_said_so(engine: Any) -> None:
    def refuse(e: Engine, sid: int) -> None:
        fields = [(b":status", b"200"), (b"content-type", b"application/grpc"),
                  (b"grpc-status", b"12")]  # fmt: skip
        e.conn.send_headers(sid, fields, end_stream=True)

    _, upstream = await engine(refuse)
    exchange, seen = await _exchange(upstream)
    await exchange.wait(5.0)
    assert exchange.head_ended and exchange.trailers is None
    assert seen.head is not None and seen.head.headers["grpc-status"] == "12"
    upstream.close()


async def test_a_streamed_body_the_engine_does_not_read_is_bounded() -> None:
    """An engine that reads nothing (its window never opens past the first 64 KiB): past
    ``MAX_UNSENT`` held back, the exchange ends, as a failure the relay can report."""

    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await done.wait()  # reads nothing until the test ends, then closes its side
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    upstream = H2Upstream("127.0.0.1", server.sockets[0].getsockname()[1], "e:1", 5.0)
    exchange, _ = await upstream.acquire()
    seen, tail = Seen(), Tail()
    exchange.send("POST", GRPC_HEAD, b"\x00\x00\x00\x00\x00", seen.on_head, tail)
    assert tail.sink is not None
    for _ in range(MAX_UNSENT // (1 << 20) + 1):
        tail.sink(bytes(1 << 20), False)
    with pytest.raises(UpstreamClosed):
        await exchange.wait(5.0)
    assert exchange.ended
    upstream.close()
    done.set()
    server.close()
    await server.wait_closed()
