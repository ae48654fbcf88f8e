"""A connection's life (``wire/server.py``): the client going away, idle and slowloris
timeouts, handlers that fail or leave a response unfinished, shutdown; and nothing left behind
once it closes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import weakref

import aiohttp
import pytest

from llmobs.wire.server import Request
from tests.support.backpressure import Flow, flood, small_receiver
from tests.support.leaks import cyclic_garbage
from tests.support.protocol_server import (
    Seen,
    ServeFactory,
    blocked,
    echo,
    on_uvloop,
)
from tests.support.rawhttp import (
    WAIT,
    chunked,
    closed,
    get,
    post,
    read_head,
    read_response,
    read_to_eof,
)
from tests.support.servers import eventually

# -- the client going away ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["abort", "close"])
async def test_a_client_leaving_cancels_its_handler(serve: ServeFactory, how: str) -> None:
    seen = Seen()
    served = await serve(blocked(seen, asyncio.Event()))
    client = await served.connect()
    await client.send(get("/wait"))
    await asyncio.wait_for(seen.started.wait(), WAIT)
    if how == "abort":
        client.writer.transport.abort()
    else:
        client.writer.close()
    await asyncio.wait_for(seen.cancelled.wait(), WAIT)
    await eventually(lambda: not served.server.connections)


async def test_a_client_leaving_during_the_body_cancels_its_handler(
    serve: ServeFactory,
) -> None:
    seen = Seen()

    async def read(request: Request) -> None:
        seen.started.set()
        try:
            await request.read_body(WAIT * 2)
        except asyncio.CancelledError:
            seen.cancelled.set()
            raise

    served = await serve(read)
    client = await served.connect()
    await client.send(post("/upload", b"x" * 100)[:-50])
    await asyncio.wait_for(seen.started.wait(), WAIT)
    client.writer.transport.abort()
    await asyncio.wait_for(seen.cancelled.wait(), WAIT)


# -- timeouts -------------------------------------------------------------------------------


async def test_an_idle_connection_is_closed_after_client_timeout(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), client_timeout=0.5)
    client = await served.connect()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await closed(client.reader)
    assert 0.3 < loop.time() - start < WAIT


async def test_an_idle_keep_alive_connection_is_closed_after_client_timeout(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    served = await serve(echo(seen), client_timeout=0.5)
    client = await served.connect()
    await client.send(get("/once"))
    await read_response(client.reader)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await closed(client.reader)
    assert 0.3 < loop.time() - start < WAIT


async def test_a_slowloris_head_is_closed_after_client_timeout(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), client_timeout=0.5)
    client = await served.connect()
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def trickle() -> None:  # a header line every 0.1 s, never the blank line
        await client.send(b"GET / HTTP/1.1\r\n")
        for i in range(100):
            await asyncio.sleep(0.1)
            await client.send(b"X-%d: v\r\n" % i)

    dripping = asyncio.create_task(trickle())
    try:
        assert await closed(client.reader)
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await dripping
    assert 0.3 < loop.time() - start < WAIT
    assert seen.requests == []


async def test_a_handler_running_past_client_timeout_is_not_cut(serve: ServeFactory) -> None:
    async def slow(request: Request) -> None:
        request.begin(200, "OK", [], None)
        request.write(b"first")
        await asyncio.sleep(1.0)  # twice the client timeout: the stream is not idle
        request.write(b"second")
        request.end()

    served = await serve(slow, client_timeout=0.5)
    client = await served.connect()
    await client.send(get("/slow"))
    response = await read_response(client.reader)
    assert response.body == b"firstsecond"


# -- handlers that fail ---------------------------------------------------------------------


async def test_a_handler_that_raises_gets_a_500_and_a_close(serve: ServeFactory) -> None:
    async def fail(request: Request) -> None:
        raise RuntimeError("boom")

    served = await serve(fail)
    client = await served.connect()
    await client.send(get("/fail") + get("/never"))
    response = await read_response(client.reader)
    assert response.status == 500
    assert response.header("Connection") == "close"
    assert json.loads(response.body)["error"] == {
        "message": "llmobs: internal error",
        "type": "internal_error",
        "code": 500,
    }
    assert await closed(client.reader)


async def test_a_handler_that_returns_without_answering_gets_a_500(serve: ServeFactory) -> None:
    async def silent(request: Request) -> None:
        return None

    served = await serve(silent)
    client = await served.connect()
    await client.send(get("/silent"))
    response = await read_response(client.reader)
    assert response.status == 500
    assert response.header("Connection") == "close"
    assert await closed(client.reader)


@pytest.mark.parametrize("how", ["returns", "raises"])
async def test_a_response_begun_and_not_ended_is_cut_by_a_close(
    serve: ServeFactory, how: str
) -> None:
    async def unfinished(request: Request) -> None:
        request.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
        request.write(b"data: 1\n\n")
        if how == "raises":
            raise RuntimeError("upstream went away")

    served = await serve(unfinished)
    client = await served.connect()
    await client.send(get("/cut") + get("/never"))
    status, _, headers = await read_head(client.reader)
    assert status == 200
    assert ("Transfer-Encoding", "chunked") in headers
    rest = await read_to_eof(client.reader)
    assert rest == b"9\r\ndata: 1\n\n\r\n"  # one chunk, no last chunk: visibly cut


async def test_a_cut_response_is_an_error_for_an_http_client(serve: ServeFactory) -> None:
    async def unfinished(request: Request) -> None:
        request.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
        request.write(b"data: 1\n\n")

    served = await serve(unfinished)
    async with aiohttp.ClientSession() as session, session.get(served.url + "/cut") as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()


# -- shutdown -------------------------------------------------------------------------------


async def test_shutdown_closes_idle_connections_at_once(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), client_timeout=30.0)
    idle = await served.connect()
    used = await served.connect()
    await used.send(get("/one"))
    await read_response(used.reader)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(served.server.shutdown(10.0), WAIT)
    assert await closed(idle.reader)
    assert await closed(used.reader)
    assert loop.time() - start < WAIT - 1  # not the grace, not the client timeout
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", served.port), WAIT)


async def test_shutdown_lets_a_busy_handler_finish_within_the_grace(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    release = asyncio.Event()
    served = await serve(blocked(seen, release), client_timeout=30.0)
    idle = await served.connect()
    client = await served.connect()
    await client.send(get("/busy"))
    await asyncio.wait_for(seen.started.wait(), WAIT)
    loop = asyncio.get_running_loop()
    start = loop.time()
    shutdown = asyncio.create_task(served.server.shutdown(30.0))
    assert await closed(idle.reader)  # at once, while the busy one still runs
    assert not shutdown.done()
    release.set()
    await asyncio.wait_for(shutdown, WAIT)
    assert loop.time() - start < WAIT  # returned when the handler did, not after the grace
    response = await read_response(client.reader)
    assert (response.status, response.body) == (200, b"released")
    assert response.header("Connection") == "close"
    assert await closed(client.reader)
    assert not seen.cancelled.is_set()


async def test_shutdown_cancels_a_handler_that_outlasts_the_grace(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(blocked(seen, asyncio.Event()))
    client = await served.connect()
    await client.send(get("/stuck"))
    await asyncio.wait_for(seen.started.wait(), WAIT)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(served.server.shutdown(0.3), WAIT)
    assert 0.2 < loop.time() - start < WAIT
    await asyncio.wait_for(seen.cancelled.wait(), WAIT)
    assert await closed(client.reader)
    assert not served.server.connections


async def test_a_shutdown_after_a_keep_alive_head_closes_after_its_response(
    serve: ServeFactory,
) -> None:
    """A shutdown that comes once a response promised keep-alive: the response goes whole,
    as promised, then the connection closes; the request pipelined behind it is not taken
    (the state, ``SENDING`` then ``SENDING_LAST``, says what follows the handler's return)."""
    begun, release = asyncio.Event(), asyncio.Event()
    targets: list[str] = []

    async def handle(request: Request) -> None:
        targets.append(request.target)
        request.begin(200, "OK", [("Content-Type", "text/plain")], 4)
        begun.set()
        await release.wait()
        request.write(b"done")
        request.end()

    served = await serve(handle, client_timeout=30.0)
    client = await served.connect()
    await client.send(get("/first") + get("/second"))
    await asyncio.wait_for(begun.wait(), WAIT)
    shutdown = asyncio.create_task(served.server.shutdown(30.0))
    await asyncio.sleep(0)  # the shutdown marks the busy connection, and waits for it
    release.set()
    response = await read_response(client.reader)
    await asyncio.wait_for(shutdown, WAIT)
    assert (response.status, response.body, response.header("Connection")) == (200, b"done", None)
    assert await closed(client.reader)
    assert targets == ["/first"]


# -- nothing left behind --------------------------------------------------------------------


async def test_a_closed_connection_leaves_no_reference_cycles(serve: ServeFactory) -> None:
    """Every object of a connection is freed by reference counting once it closes, its
    reading deferred and held on the way (a body of tiny chunks, decoded a share per loop
    turn; requests pipelined behind it): cyclic garbage waits for the collector, whose passes
    stall the loop (docs/benchmarks.md)."""

    async def handle(request: Request) -> None:
        body = await request.read_body(WAIT)
        request.respond(200, b"%d" % len(body), "text/plain")

    served = await serve(handle, max_body=1 << 20)
    tiny = b"POST /tiny HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(
        *[b"x"] * 2000
    )
    pipelined = b"".join(get(f"/{i}", "X-Pad: " + "p" * 2000) for i in range(200))

    async def once() -> None:
        client = await served.connect()
        await client.send(tiny + pipelined + get("/last", "Connection: close"))
        assert (await read_response(client.reader)).body == b"2000"
        for _ in range(201):
            assert (await read_response(client.reader)).status == 200
        assert await closed(client.reader)
        served.clients.remove(client)
        client.writer.close()

    await once()  # warm
    await eventually(lambda: not served.server.connections)
    with cyclic_garbage() as cyclic:
        for _ in range(3):
            await once()
        await eventually(lambda: not served.server.connections)
    assert cyclic == []


async def test_a_connection_cut_while_paused_leaves_nothing_behind(serve: ServeFactory) -> None:
    """A client gone while its response was paused takes its send timeout with it: the
    connection is not kept alive by a pending timer."""
    flow = Flow()
    served = await serve(flood(flow), client_timeout=30.0)
    client = await small_receiver(served)
    await client.send(get("/flood"))
    await asyncio.wait_for(flow.paused.wait(), WAIT)
    (conn,) = served.server.connections
    gone = weakref.ref(conn)
    del conn
    client.writer.transport.abort()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while served.server.connections or gone() is not None:
        assert loop.time() < deadline, "the connection outlived its client"
        gc.collect()
        await asyncio.sleep(0.01)


test_on_uvloop = on_uvloop(__name__)
