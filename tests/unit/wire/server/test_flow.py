"""Back-pressure: a client that stops reading pauses the handler's source and is told of it
(``on_flow``, ``on_gone``); it is cut off only when it takes nothing."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import weakref
from dataclasses import dataclass, field

from llmobs.wire.server import (
    HIGH_WATER,
    LOW_WATER,
    Request,
)
from tests.support.protocol_server import (
    Handler,
    Served,
    ServeFactory,
    on_uvloop,
)
from tests.support.rawhttp import (
    WAIT,
    Client,
    get,
    read_response,
)

# -- back-pressure --------------------------------------------------------------------------


async def small_receiver(served: Served) -> Client:
    """A client whose socket buffers little, so that what it does not read piles up in the
    server's transport."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(
        asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port)), WAIT
    )
    return await served.connect(sock)


@dataclass
class Flow:
    paused: asyncio.Event = field(default_factory=asyncio.Event)
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[tuple[str, int]] = field(default_factory=list)
    written: int = 0


def flood(flow: Flow, chunk: int = 16 * 1024, early: int = 0, sndbuf: int | None = 4096) -> Handler:
    """Streams until told to pause (at most 64 MiB), then waits to be resumed and ends.
    ``early`` bytes go out before ``on_flow`` is called; ``sndbuf``: the socket's send
    buffer (None: the kernel's own, autotuned to a few MiB)."""

    async def handle(request: Request) -> None:
        transport = request.transport
        if sndbuf is not None:
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)

        def pause() -> None:
            flow.events.append(("pause", transport.get_write_buffer_size()))
            flow.paused.set()

        def resume() -> None:
            flow.events.append(("resume", transport.get_write_buffer_size()))
            flow.resumed.set()

        request.begin(200, "OK", [("Content-Type", "application/octet-stream")], None)
        if early:
            request.write(b"e" * early)
            flow.written += early
        request.on_flow(pause, resume)
        data = b"x" * chunk
        for _ in range(64 * 1024 * 1024 // chunk):
            if flow.paused.is_set():
                break
            request.write(data)
            flow.written += chunk
            await asyncio.sleep(0)
        await asyncio.wait_for(flow.resumed.wait(), WAIT * 2)
        request.on_flow(None, None)
        request.end()

    return handle


async def test_a_client_that_does_not_read_pauses_and_then_resumes_the_handler(
    serve: ServeFactory,
) -> None:
    flow = Flow()
    served = await serve(flood(flow))
    client = await small_receiver(served)
    await client.send(get("/flood"))
    await asyncio.wait_for(flow.paused.wait(), WAIT)
    assert not flow.resumed.is_set()
    response = await read_response(client.reader)  # drains: the server resumes
    assert response.status == 200
    assert len(response.body) == flow.written
    assert [e for e, _ in flow.events] == ["pause", "resume"]
    (_, at_pause), (_, at_resume) = flow.events
    assert at_pause > HIGH_WATER
    assert at_resume <= LOW_WATER


async def test_on_gone_is_told_once_when_the_client_goes(serve: ServeFactory) -> None:
    """``on_gone`` hears of a client's going (its EOF here, then the connection lost) once,
    before the handler's cancellation reaches it; a handler that cleared it with
    ``on_gone(None)`` hears nothing; one whose callback raises is still cancelled when the
    client resets (``connection_lost`` alone)."""
    targets = ("/keep", "/clear", "/raise")
    heard: list[tuple[str, bool]] = []  # (which request, cancelled by then)
    begun = {target: asyncio.Event() for target in targets}
    cancelled = {target: asyncio.Event() for target in targets}

    async def handle(request: Request) -> None:
        target = request.target

        def gone() -> None:
            heard.append((target, cancelled[target].is_set()))
            if target == "/raise":  # a bug of the handler's: the connection's cleanup goes on
                raise RuntimeError("on_gone failed")

        request.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
        request.on_gone(gone)
        if target == "/clear":
            request.on_gone(None)
        begun[target].set()
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            cancelled[target].set()
            raise

    served = await serve(handle)
    for target in targets:
        client = await served.connect()
        await client.send(get(target))
        await asyncio.wait_for(begun[target].wait(), WAIT)
        if target == "/raise":  # a reset: connection_lost alone, which must cancel still
            sock = client.writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.writer.transport.abort()
        else:
            client.writer.write_eof()
        await asyncio.wait_for(cancelled[target].wait(), WAIT)
    assert heard == [("/keep", False), ("/raise", False)]


async def test_on_flow_pauses_at_once_when_the_buffer_is_already_full(
    serve: ServeFactory,
) -> None:
    flow = Flow()
    served = await serve(flood(flow, early=4 * HIGH_WATER))
    client = await small_receiver(served)
    await client.send(get("/flood"))
    await asyncio.wait_for(flow.paused.wait(), WAIT)
    assert flow.written == 4 * HIGH_WATER  # paused by on_flow itself, before the loop wrote
    response = await read_response(client.reader)
    assert len(response.body) == flow.written
    assert [e for e, _ in flow.events] == ["pause", "resume"]


async def test_a_client_that_takes_nothing_is_cut_off(serve: ServeFactory) -> None:
    """A client that stops reading holds its stream for ``client_timeout`` at most (0.5 s
    here), counted from the pause; then its connection is closed and its handler ends."""
    flow = Flow()
    served = await serve(flood(flow), client_timeout=0.5)
    client = await small_receiver(served)
    await client.send(get("/flood"))
    await asyncio.wait_for(flow.paused.wait(), WAIT)
    loop = asyncio.get_running_loop()
    paused = loop.time()
    await asyncio.sleep(0.25)
    assert served.server.connections  # not yet
    while served.server.connections:
        assert loop.time() - paused < WAIT, "never cut off"
        await asyncio.sleep(0.01)
    assert loop.time() - paused >= 0.45
    assert not flow.resumed.is_set()


async def test_a_client_that_caught_up_is_not_cut_off_later(serve: ServeFactory) -> None:
    """The send timeout ends when the client's buffer drains: a client that paused once
    and then read everything keeps its connection, here through a next request whose
    answer takes three timeouts to come."""
    flow = Flow()
    streamer = flood(flow)

    async def handle(request: Request) -> None:
        if request.target == "/flood":
            await streamer(request)
        else:
            await asyncio.sleep(1.5)
            request.respond(200, b"late")

    served = await serve(handle, client_timeout=0.5)
    client = await small_receiver(served)
    await client.send(get("/flood"))
    await asyncio.wait_for(flow.paused.wait(), WAIT)
    assert (await read_response(client.reader)).status == 200  # all of it, at once
    await client.send(get("/late"))
    response = await read_response(client.reader)
    assert (response.status, response.body) == (200, b"late")


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


async def slow_read(client: Client, size: int, pause: float) -> bytes:
    """A whole chunked response, read ``size`` bytes at a time, ``pause`` s apart."""
    raw = bytearray()
    while not raw.endswith(b"\r\n0\r\n\r\n"):
        data = await asyncio.wait_for(client.reader.read(size), WAIT)
        assert data, f"cut off after {len(raw)} bytes"
        raw += data
        await asyncio.sleep(pause)
    return bytes(raw)


async def test_a_slow_reader_is_not_cut_off(serve: ServeFactory) -> None:
    """The send timeout is for a client that takes nothing: one that takes its response
    slowly (16 KiB every 0.1 s, so that its buffer drains from the high mark to the low one
    in over a second) is not cut off by a 0.5 s timeout, and gets all of it."""
    flow = Flow()
    served = await serve(flood(flow), client_timeout=0.5)
    client = await small_receiver(served)
    await client.send(get("/flood"))
    await asyncio.wait_for(flow.paused.wait(), WAIT)
    raw = await slow_read(client, 16 * 1024, 0.1)
    assert [e for e, _ in flow.events] == ["pause", "resume"]
    assert raw[raw.index(b"\r\n\r\n") :].count(b"x") == flow.written


async def test_a_slow_reader_behind_a_large_send_buffer_is_not_cut_off(
    serve: ServeFactory,
) -> None:
    """The same with the kernel's own send buffer, a few MiB: the transport's buffer moves
    only when a third of that frees, which takes a slow reader longer than the timeout, so
    progress is counted in the kernel's send queue too (``SIOCOUTQ``)."""
    flow = Flow()
    served = await serve(flood(flow, sndbuf=None), client_timeout=0.5)
    client = await small_receiver(served)
    await client.send(get("/flood"))
    await asyncio.wait_for(flow.paused.wait(), WAIT)
    raw = await slow_read(client, 128 * 1024, 0.1)
    assert raw[raw.index(b"\r\n\r\n") :].count(b"x") == flow.written


test_on_uvloop = on_uvloop(__name__)
