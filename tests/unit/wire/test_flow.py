"""Flow control (``wire/flow.py``): a connection's reading held, deferred to the next loop turn
and taken up again (``Reading``), against a real transport whose reading the test sees; and
the send timeout (``SendTimeout``), which cuts off a client that takes nothing of its response,
and only such a client: one that reads slowly, or caught up, is kept."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from llmobs.wire.flow import Reading, SendTimeout
from llmobs.wire.server import Request
from tests.support.backpressure import Flow, flood, slow_read, small_receiver
from tests.support.protocol_server import ServeFactory, on_uvloop
from tests.support.rawhttp import WAIT, get, read_response


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[tuple[asyncio.Transport, socket.socket]]:
    """A client transport over loopback, and the server's end as a plain socket that reads
    only when the test says."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        transport, _ = await loop.create_connection(asyncio.Protocol, *listener.getsockname())
        peer, _ = listener.accept()  # connected already: no wait
    try:
        yield transport, peer
    finally:
        transport.abort()
        peer.close()
        await asyncio.sleep(0)  # the transport's close runs


class Work:
    """A deferred share of work with ``shares`` turns' worth left; counts the turns it ran."""

    def __init__(self, shares: int) -> None:
        self.left = shares
        self.turns = 0

    def __call__(self) -> bool:
        self.turns += 1
        self.left -= 1
        return self.left > 0


async def next_turn() -> None:
    """Let the loop run the callbacks made ready before this one (a deferred share's turn)."""
    await asyncio.sleep(0)


# -- Reading --------------------------------------------------------------------------------


async def test_held_reading_stops_until_released() -> None:
    async with connected() as (transport, _):
        reading = Reading(asyncio.get_running_loop())
        reading.transport = transport
        reading.hold()
        reading.hold()  # held once: one release reads again
        assert (reading.held, transport.is_reading()) == (True, False)
        reading.release()
        assert (reading.held, transport.is_reading()) == (False, True)
        reading.release()  # not held: nothing changes
        assert transport.is_reading()


async def test_deferred_work_runs_a_share_per_turn_then_reading_resumes() -> None:
    """Deferred work never runs in the turn that deferred it: each share in a turn of its
    own, reading paused until the last share says nothing is left."""
    async with connected() as (transport, _):
        reading = Reading(asyncio.get_running_loop())
        reading.transport = transport
        work = Work(shares=3)
        reading.defer(work)
        assert (work.turns, reading.deferred, transport.is_reading()) == (0, True, False)
        for turns in (1, 2):
            await next_turn()
            assert (work.turns, transport.is_reading()) == (turns, False)
        await next_turn()
        assert (work.turns, reading.deferred, transport.is_reading()) == (3, False, True)
        await next_turn()
        assert work.turns == 3  # done: no more turns


async def test_a_deferred_share_waits_while_reading_is_held() -> None:
    """What a deferred share would decode has nowhere to go while the connection is held:
    it waits for the release, and reading resumes only after it."""
    async with connected() as (transport, _):
        reading = Reading(asyncio.get_running_loop())
        reading.transport = transport
        work = Work(shares=1)
        reading.defer(work)
        reading.hold()
        for _ in range(3):
            await next_turn()
        assert (work.turns, transport.is_reading()) == (0, False)
        reading.release()
        assert not transport.is_reading()  # the share first, in the next turn
        await next_turn()
        assert (work.turns, reading.deferred, transport.is_reading()) == (1, False, True)


async def test_a_stopped_reading_takes_no_more_turns_and_a_reset_reads_again() -> None:
    async with connected() as (transport, _):
        reading = Reading(asyncio.get_running_loop())
        reading.transport = transport
        work = Work(shares=5)
        reading.defer(work)
        reading.stop()  # the connection closes: the share is dropped
        for _ in range(3):
            await next_turn()
        assert (work.turns, transport.is_reading()) == (0, False)
        reading.hold()
        reading.reset()  # a lingering close drains what comes: neither held nor deferred
        assert (reading.held, reading.deferred, transport.is_reading()) == (False, False, True)
        await next_turn()
        assert work.turns == 0


# -- SendTimeout ----------------------------------------------------------------------------


async def unread(transport: asyncio.Transport) -> int:
    """Write more than the sockets on the way hold, to a peer that reads none of it; returns
    the socket's descriptor, for the kernel's send queue."""
    transport.write(b"x" * (32 << 20))
    await next_turn()
    assert transport.get_write_buffer_size() > 0
    sock = transport.get_extra_info("socket")
    return int(sock.fileno())


async def test_a_client_that_takes_nothing_is_stalled_once_after_the_timeout() -> None:
    loop = asyncio.get_running_loop()
    async with connected() as (transport, _):
        sending = SendTimeout(loop, 0.2)
        sending.watch(transport, await unread(transport))
        stalled: list[float] = []
        start = loop.time()
        sending.pause(lambda: stalled.append(loop.time() - start))
        while not stalled:
            assert loop.time() - start < WAIT, "never stalled"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # and not again
        assert len(stalled) == 1
        assert stalled[0] >= 0.19  # (the loop's clock resolution aside)


async def test_a_timeout_stopped_or_paused_again_calls_only_the_last_callback_once() -> None:
    """``stop`` (the client caught up, or left) cancels it; a second ``pause`` keeps the
    timer running and replaces what it calls."""
    loop = asyncio.get_running_loop()
    async with connected() as (transport, _):
        fd = await unread(transport)
        stopped, paused = SendTimeout(loop, 0.1), SendTimeout(loop, 0.1)
        calls: list[str] = []
        stopped.watch(transport, fd)
        stopped.pause(lambda: calls.append("stopped"))
        stopped.stop()
        paused.watch(transport, fd)
        paused.pause(lambda: calls.append("first"))
        paused.pause(lambda: calls.append("second"))
        start = loop.time()
        while not calls:
            assert loop.time() - start < WAIT, "never stalled"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # three periods more: nothing else comes
        assert calls == ["second"]


# -- through the server ---------------------------------------------------------------------


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
