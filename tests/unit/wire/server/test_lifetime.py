"""A connection's life: the client going away, idle and slowloris timeouts, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import pytest

from llmobs.wire.server import (
    Request,
)
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
    read_response,
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


def _ours(obj: object) -> bool:
    """Whether ``obj`` is the server's: an instance of, or a function from, ``llmobs``."""
    module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    return isinstance(module, str) and module.startswith("llmobs")


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
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            await once()
        await eventually(lambda: not served.server.connections)
        gc.collect()
        cyclic = [o for o in gc.garbage if _ours(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == []


test_on_uvloop = on_uvloop(__name__)
