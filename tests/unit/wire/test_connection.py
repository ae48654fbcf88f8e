"""One connection to the engine (``wire/connection.py``): a response read at the protocol
level, its head (interim ones skipped, bounded) and its body (however framed) handed on inside
the read; what follows it read from the state (reuse, or not); the read timeout, which does not
run while reads are held for a slow client; a close, at once when a request is not wholly
sent. Against engines scripted byte by byte, alone and behind a sidecar."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from llmobs.wire.connection import (
    MAX_INTERIM,
    Connection,
    OnBody,
    UpstreamClosed,
    UpstreamTimeout,
)
from llmobs.wire.connection import (
    Exchange as EngineExchange,
)
from llmobs.wire.habits import Habits
from llmobs.wire.http1 import MAX_HEAD_BYTES, ProtocolError, ResponseHead
from llmobs.wire.states import EngineState
from tests.support.backpressure import Flood, read_events, slow_client
from tests.support.rawhttp import WAIT
from tests.support.servers import SidecarFactory, eventually
from tests.support.upstreams import SSE_HEAD, raw_upstream

QUIET = {"engine_scrape_interval": 0, "gpu_sample_interval": 0}
GET = b"GET / HTTP/1.1\r\nHost: engine\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Connect = Callable[..., Awaitable[Connection]]


@contextlib.asynccontextmanager
async def engine(serve: Serve) -> AsyncIterator[Connect]:
    """An engine on loopback that runs ``serve`` for each connection; yields ``connect``,
    which opens a ``Connection`` to it (``habits``: the pool's, else its own)."""
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    opened: list[Connection] = []

    async def connect(habits: Habits | None = None) -> Connection:
        _, conn = await loop.create_connection(
            lambda: Connection(loop, {}, habits), "127.0.0.1", port
        )
        opened.append(conn)
        return conn

    try:
        yield connect
    finally:
        for conn in opened:
            conn.close()
        server.close()
        await asyncio.sleep(0.05)  # the engine's handlers see their connections close


class Exchange:
    """One exchange's callbacks: the heads that came, the body, and the state at each read."""

    def __init__(self) -> None:
        self.heads: list[int] = []
        self.body = b""
        self.states: list[EngineState] = []

    def on_head(self, conn: EngineExchange, head: ResponseHead) -> OnBody:
        self.heads.append(head.status)

        assert isinstance(conn, Connection)

        def on_body(payload: bytes, frame: bytes | None, last: bool) -> None:
            self.body += payload
            self.states.append(conn.state)

        return on_body


def answer(reply: bytes, pieces: int = 1, close: bool = False) -> Serve:
    """An engine that reads a request's head and writes ``reply`` (in ``pieces`` writes, a
    read each most of the time: either is right), then closes (``close``) or waits for the
    close."""
    step = -(-len(reply) // pieces) or 1

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for at in range(0, len(reply), step):
                writer.write(reply[at : at + step])
                await writer.drain()
                await asyncio.sleep(0.005 if pieces > 1 else 0)
            if not close:
                await reader.read()
        writer.close()

    return serve


# -- the response head ----------------------------------------------------------------------


@pytest.mark.parametrize(("interim", "fails"), [(MAX_INTERIM, False), (MAX_INTERIM + 1, True)])
async def test_interim_responses_are_skipped_up_to_a_bound(interim: int, fails: bool) -> None:
    """``100 Continue`` and ``103 Early Hints`` before the response are no response: the head
    the handler gets is the final one. An engine that sends more than ``MAX_INTERIM`` of them
    in a read is not talking HTTP to us."""
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"
    heads = (b"HTTP/1.1 100 Continue\r\n\r\n" + hints) * (interim // 2) + hints * (interim % 2)
    async with engine(answer(heads + OK)) as connect:
        conn, exchange = await connect(), Exchange()
        conn.send("GET", GET, b"", exchange.on_head)
        if fails:
            with pytest.raises(ProtocolError, match="interim"):
                await asyncio.wait_for(conn.wait(WAIT), WAIT)
            assert (exchange.heads, conn.reusable) == ([], False)
        else:
            await asyncio.wait_for(conn.wait(WAIT), WAIT)
            assert (exchange.heads, exchange.body, conn.state) == ([200], b"ok", EngineState.IDLE)


@pytest.mark.parametrize("pieces", [1, 16])
@pytest.mark.parametrize(("size", "fails"), [(MAX_HEAD_BYTES, False), (MAX_HEAD_BYTES + 1, True)])
async def test_a_head_over_the_limit_is_refused_however_it_comes(
    pieces: int, size: int, fails: bool
) -> None:
    """The limit is on the head before its blank line, whether it comes in one read or many
    (each read adds to what came, and the whole is checked)."""
    start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: "
    head = start + b"a" * (size - len(start)) + b"\r\n\r\nok"
    async with engine(answer(head, pieces)) as connect:
        conn, exchange = await connect(), Exchange()
        conn.send("GET", GET, b"", exchange.on_head)
        if fails:
            with pytest.raises(ProtocolError, match="too large"):
                await asyncio.wait_for(conn.wait(WAIT), WAIT)
            assert exchange.heads == []
        else:
            await asyncio.wait_for(conn.wait(WAIT), WAIT)
            assert (exchange.heads, exchange.body) == ([200], b"ok")


async def test_an_engine_silent_past_the_read_timeout_is_timed_out() -> None:
    """No head within the read timeout: the exchange fails as timed out, and the connection,
    whose response may still come, is never reused."""
    loop = asyncio.get_running_loop()
    async with engine(answer(b"")) as connect:
        conn = await connect()
        conn.send("GET", GET, b"", Exchange().on_head)
        start = loop.time()
        with pytest.raises(UpstreamTimeout):
            await asyncio.wait_for(conn.wait(0.2), WAIT)
        assert loop.time() - start >= 0.19  # (the loop's clock resolution aside)
        assert not conn.reusable


async def test_a_handler_that_fails_on_the_head_gets_its_error_back() -> None:
    """``on_head`` raising (the relay's bug, or a client gone): ``wait`` raises it, and the
    connection, its response part read, is closed."""

    def on_head(conn: EngineExchange, head: ResponseHead) -> OnBody:
        raise ConnectionResetError("the client went away")

    async with engine(answer(OK)) as connect:
        conn = await connect()
        conn.send("GET", GET, b"", on_head)
        with pytest.raises(ConnectionResetError, match="the client went away"):
            await asyncio.wait_for(conn.wait(WAIT), WAIT)
        await eventually(lambda: conn.closed)


# -- what follows the response --------------------------------------------------------------


async def test_bytes_after_the_response_or_between_exchanges_end_the_connection() -> None:
    """What comes after a response's end (in its last read, or while no request is pending)
    belongs to no exchange: the connection carries no more requests."""
    replies, junk = [OK + b"HTTP/1.1", OK], asyncio.Event()  # a second response, unasked

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(replies.pop(0))
        await writer.drain()
        await junk.wait()
        writer.write(b"junk")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            await reader.read()
        writer.close()

    async with engine(serve) as connect:
        after, between, exchange = await connect(), await connect(), Exchange()
        after.send("GET", GET, b"", exchange.on_head)
        await asyncio.wait_for(after.wait(WAIT), WAIT)
        assert (exchange.body, after.reusable) == (b"ok", False)
        between.send("GET", GET, b"", Exchange().on_head)
        await asyncio.wait_for(between.wait(WAIT), WAIT)
        assert between.reusable  # until the engine's unasked bytes come
        junk.set()
        await eventually(lambda: between.closed)
        with pytest.raises(UpstreamClosed):
            between.send("GET", GET, b"", Exchange().on_head)


async def test_a_streamed_response_teaches_and_follows_the_engines_habit() -> None:
    """An engine that closes its connection at once after a chunked response, having offered
    keep-alive: the close teaches the pool's ``Habits``, and from then on the connection of
    a chunked response is spent at its end, not reused."""
    chunked = SSE_HEAD + b"\r\n2\r\nok\r\n0\r\n\r\n"

    habits = Habits()
    async with engine(answer(chunked, close=True)) as connect:  # closed at once
        first = await connect(habits)
        first.send("GET", GET, b"", Exchange().on_head)
        await asyncio.wait_for(first.wait(WAIT), WAIT)
        assert first.streamed
        first.idle_since = first.last_read  # back in the pool (``Upstream.release``)
        await eventually(lambda: first.closed)
        assert habits.closes_after_stream is True
        second = await connect(habits)
        second.send("GET", GET, b"", Exchange().on_head)
        await asyncio.wait_for(second.wait(WAIT), WAIT)
        assert (second.state, second.reusable) == (EngineState.SPENT, False)


@pytest.mark.parametrize(
    ("head", "after"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", EngineState.IDLE),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n", EngineState.SPENT),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", EngineState.SPENT),
    ],
    ids=["keep-alive", "close", "http-1.0"],
)
async def test_what_follows_a_response_is_the_state_its_head_left(
    head: bytes, after: EngineState
) -> None:
    """A head that forbids reuse leaves the connection ``RELAYING_LAST`` while its body
    comes, and spent at its end; one that allows it, back to ``IDLE`` (the pool's). The head
    comes over two reads (``ANSWERING`` between), the body over two more."""
    more = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head[:12])
        await writer.drain()
        await more.wait()
        for part in (head[12:] + b"o", b"k"):  # the rest of the head, then the body, in parts
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.05)
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    async with engine(serve) as connect:
        conn, exchange = await connect(), Exchange()
        conn.send("GET", GET, b"", exchange.on_head)
        waited = asyncio.ensure_future(conn.wait(WAIT))
        await eventually(lambda: conn.state is EngineState.ANSWERING)
        more.set()
        await asyncio.wait_for(waited, WAIT)
        relaying = EngineState.RELAYING if after is EngineState.IDLE else EngineState.RELAYING_LAST
        assert exchange.states[0] is relaying
        assert (conn.state, conn.reusable) == (after, after is EngineState.IDLE)


@pytest.mark.parametrize(
    ("reply", "unanswered"),
    [
        (b"", True),  # nothing at all: the engine may never have read the request
        (b"HTTP/1.1 200 OK\r\nContent-Ty", False),  # part of a head
        (b"HTTP/1.1 100 Continue\r\n\r\n", False),  # an interim response
    ],
    ids=["silent", "part-of-a-head", "interim"],
)
async def test_a_connection_closed_unanswered_is_told_apart(reply: bytes, unanswered: bool) -> None:
    """The engine closes the connection after ``reply``: the exchange fails as closed, and
    the state says whether any of a response came (``unanswered``: what lets the relay send
    an idempotent request again), read from the table, not a flag."""

    def on_head(c: EngineExchange, response: ResponseHead) -> OnBody:
        raise AssertionError("no head comes")

    async with engine(answer(reply, close=True)) as connect:
        conn = await connect()
        conn.send("GET", GET, b"", on_head)
        with pytest.raises(UpstreamClosed):
            await asyncio.wait_for(conn.wait(WAIT), WAIT)
        assert (conn.unanswered, conn.closed, conn.reusable) == (unanswered, True, False)
        conn.close()
        assert conn.unanswered is unanswered  # closed again: nothing to undo


async def test_closing_a_connection_mid_body_ends_it_at_once() -> None:
    """A graceful close waits for the write buffer to drain, and an engine that reads
    nothing more never drains it: the socket would be held, the engine never told. A close
    with a request not wholly sent therefore aborts (the relay closes a connection whose
    client went away, mid-stream), and the exchange ends long before its read timeout."""
    finished = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head only: the body is never read
        writer.write(SSE_HEAD + b"\r\n")
        await asyncio.sleep(0.3)  # the chunk comes while the relay waits for the body
        writer.write(b"5\r\nhello\r\n")
        await writer.drain()
        await finished.wait()
        writer.transport.abort()

    heads: list[int] = []

    def on_head(c: EngineExchange, response: ResponseHead) -> OnBody:
        heads.append(response.status)
        return lambda payload, frame, last: c.close()  # the client went away

    async with engine(serve) as connect:
        conn = await connect()
        body = b"x" * (16 << 20)  # far more than the socket buffers hold
        head = b"POST / HTTP/1.1\r\nHost: engine\r\nContent-Length: %d\r\n\r\n" % len(body)
        conn.send("POST", head, body, on_head)  # more than the engine will ever read
        start = asyncio.get_running_loop().time()
        try:
            with pytest.raises(ConnectionError):  # aborted: not the read timeout's TimeoutError
                await asyncio.wait_for(conn.wait(30.0), 10.0)
        finally:
            finished.set()
        assert heads == [200]
        assert asyncio.get_running_loop().time() - start < 5.0
        assert conn.closed  # the socket is gone, not waiting to drain


# -- behind a sidecar -----------------------------------------------------------------------


async def test_connection_close_and_unframed_bodies_are_relayed_whole(
    start_sidecar: SidecarFactory,
) -> None:
    payload = b"x" * 100_000

    async def until_close(writer: asyncio.StreamWriter, n: int) -> bool:
        if n % 2:  # no length, no chunking: the body ends when the connection does
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(payload)
            )
        writer.write(payload)
        await writer.drain()
        return False

    async with raw_upstream(until_close) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            for _ in range(4):
                async with session.get(side.url + "/blob") as r:
                    assert r.status == 200
                    assert await r.read() == payload
        assert upstream.connections == 4
        assert side.value("llmobs_requests_total", outcome="ok") == 4


async def test_head_and_no_content_responses_have_no_body(start_sidecar: SidecarFactory) -> None:
    async def no_body(writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:  # HEAD: a length, and no body follows
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        return True

    async with raw_upstream(no_body) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            async with session.head(side.url + "/v1/models") as r:
                assert r.status == 200
                assert r.headers["Content-Length"] == "1234"
            async with session.delete(side.url + "/v1/files/1") as r:
                assert r.status == 204
                assert await r.read() == b""
        assert upstream.connections == 1  # both on one connection: the framing was right


async def test_an_answer_before_the_whole_body_was_sent_is_relayed(
    start_sidecar: SidecarFactory,
) -> None:
    """An engine may refuse a body before reading it (a 413) and then close or just wait:
    the response came whole and is the request's result, relayed to the client at once and
    counted once, as ok; the connection, its request not wholly sent, is not reused."""
    closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head only: the body is never read
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig")
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the sidecar drops the connection
        closed.set()
        writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        side = await start_sidecar(f"http://127.0.0.1:{port}", **QUIET)
        async with aiohttp.ClientSession() as session, session.post(
            side.url + "/v1/chat/completions", data=io.BytesIO(b"x" * (12 << 20)),
            headers={"Content-Type": "application/octet-stream"},
        ) as r:  # fmt: skip
            status, body = r.status, await r.read()
        assert (status, body) == (413, b"big")
        await eventually(lambda: side.value("llmobs_requests_total") == 1)
        assert side.value("llmobs_requests_total", outcome="ok") == 1
        await asyncio.wait_for(closed.wait(), 5.0)  # not kept in the pool
    finally:
        server.close()


async def test_an_engine_silent_after_the_client_caught_up_is_timed_out(
    start_sidecar: SidecarFactory,
) -> None:
    """The read timeout stops while reads are paused for a slow client, and runs again
    once they resume: an engine that then goes silent is timed out (``upstream_timeout``)."""
    flood = Flood(total=256, silent=True)  # 16 MB: more than the buffers on the way hold
    async with raw_upstream(flood) as (_, url):
        side = await start_sidecar(url, read_timeout=0.5, client_timeout=30, **QUIET)
        reader, writer = await slow_client(side.url)
        await asyncio.sleep(1.0)  # paused for twice the read timeout
        assert flood.sent < flood.total
        assert await read_events(reader, flood.total) == flood.total
        try:
            assert await asyncio.wait_for(reader.read(), 10) == b""  # cut, and not cleanly
            await eventually(
                lambda: side.value("llmobs_requests_total", outcome="upstream_timeout") == 1
            )
        finally:
            flood.release.set()
            writer.close()
