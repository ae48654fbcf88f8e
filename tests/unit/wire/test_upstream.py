"""The protocol-level upstream leg against raw upstreams: pooling, stale connections, framing,
back-pressure; and the sidecar under uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import io
import json
import socket
import struct
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from llmobs.app import Sidecar
from llmobs.config.settings import Settings
from llmobs.export.telemetry import build_telemetry
from llmobs.wire.http1 import ChunkedBody, ResponseHead
from llmobs.wire.upstream import Connection, OnBody, Upstream
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually
from tests.support.upstreams import (
    BODY,
    SSE_HEAD,
    keep_alive,
    post,
    raw_upstream,
)

QUIET = {"engine_scrape_interval": 0, "gpu_sample_interval": 0}
from tests.support import ROOT  # noqa: E402


async def test_sequential_requests_share_one_pooled_connection(
    start_sidecar: SidecarFactory,
) -> None:
    async with raw_upstream(keep_alive) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                status, body = await post(session, side.url)
                assert status == 200
                assert body.count(b"data: ") == 4
        assert upstream.requests == 5
        assert upstream.connections == 1
        assert side.value("llmobs_requests_total", outcome="ok") == 5
        head = upstream.heads[0].decode("latin-1")
        assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{url.rsplit(':', 1)[1]}\r\n" in head
        assert "Content-Length: " in head
        assert "transfer-encoding" not in head.lower()


async def test_a_connection_the_engine_closed_after_a_response_is_not_reused_blindly(
    start_sidecar: SidecarFactory,
) -> None:
    """The engine closes every connection after answering, without saying so (an idle
    timeout racing the next request): no request may fail for it."""

    async def close_after(writer: asyncio.StreamWriter, _: int) -> bool:
        await keep_alive(writer, 0)
        return False

    async with raw_upstream(close_after) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            results = [await post(session, side.url) for _ in range(10)]
        assert [s for s, _ in results] == [200] * 10
        assert all(body.endswith(b"data: [DONE]\n\n") for _, body in results)
        assert upstream.requests == 10
        assert side.value("llmobs_requests_total", outcome="ok") == 10


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with session.get(url + "/v1/models") as r:
        return r.status, await r.read()


@pytest.mark.parametrize(
    ("send", "reply", "statuses", "requests"),
    [
        # closed without a byte (its idle timeout fired as the request came): an idempotent
        # request is sent again on a new connection
        (get, b"", [200, 200], 3),
        # a POST is not: the engine read it, and may have failed on it (RFC 9110 9.2.2)
        (post, b"", [200, 502], 2),
        # a byte of a response means the engine took it: a cut there is a 502, never the
        # request sent a second time
        (get, b"HTTP/1.1 200 OK\r\nContent-Ty", [200, 502], 2),
    ],
    ids=["get-closed-silent-is-retried", "post-is-not", "cut-mid-head-is-not"],
)
async def test_a_pooled_connection_closed_as_a_request_arrives(
    start_sidecar: SidecarFactory,
    send: Callable[[aiohttp.ClientSession, str], Awaitable[tuple[int, bytes]]],
    reply: bytes,
    statuses: list[int],
    requests: int,
) -> None:
    """The race itself: the engine takes the second request on the pooled connection and
    closes it, with ``reply`` written first. Retried once exactly when nothing came and the
    request may be repeated."""

    async def close_second(writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            writer.write(reply)
            await writer.drain()
            return False
        return await keep_alive(writer, n)

    async with raw_upstream(close_second) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            results = [await send(session, side.url) for _ in range(2)]
        assert [s for s, _ in results] == statuses
        assert results[0][1].endswith(b"data: [DONE]\n\n")
        assert upstream.requests == requests
        assert upstream.connections == requests - 1  # a retry, on a connection of its own
        ok = statuses.count(200)
        await eventually(lambda: side.value("llmobs_requests_total", outcome="ok") == ok)
        assert side.value("llmobs_requests_total", outcome="upstream_error") == 2 - ok


async def test_a_connection_idle_past_the_idle_timeout_is_not_reused(
    start_sidecar: SidecarFactory,
) -> None:
    """An engine closes a connection idle for its keep-alive timeout, and a request sent on
    it just then fails: the pool gives connections up before (``--upstream-idle-timeout``)."""
    async with raw_upstream(keep_alive) as (upstream, url):
        side = await start_sidecar(url, upstream_idle_timeout=0.3, **QUIET)
        async with aiohttp.ClientSession() as session:
            for pause in (0.0, 0.0, 0.6, 0.0):
                await asyncio.sleep(pause)
                assert (await post(session, side.url))[0] == 200
        assert upstream.requests == 4
        assert upstream.connections == 2  # a new one after the pause only


async def test_a_new_connection_closed_without_a_response_is_a_502_not_a_retry(
    start_sidecar: SidecarFactory,
) -> None:
    """On a fresh connection the engine did see the request: sending it again could run it
    twice, so it is an upstream error."""

    async def drop(writer: asyncio.StreamWriter, n: int) -> bool:
        return False

    async with raw_upstream(drop) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            status, body = await post(session, side.url)
        assert status == 502
        assert b"upstream unavailable" in body
        assert upstream.requests == 1
        await eventually(lambda: side.value("llmobs_requests_total", outcome="upstream_error") == 1)


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


async def test_a_batch_that_ends_together_keeps_its_connections(
    start_sidecar: SidecarFactory,
) -> None:
    """300 streams at once (more than the old pool of 256), twice: the second wave reuses
    the first wave's 300 connections; none is closed only to be opened again at once."""
    wave = 300
    arrived = asyncio.Event()

    async def together(writer: asyncio.StreamWriter, n: int) -> bool:
        if n % wave == 0:
            arrived.set()  # the whole wave is in: answer them all
        await asyncio.wait_for(arrived.wait(), 20)
        return await keep_alive(writer, n)

    async with raw_upstream(together) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(2):
                arrived.clear()
                results = await asyncio.gather(*(post(session, side.url) for _ in range(wave)))
                assert [s for s, _ in results] == [200] * wave
        assert upstream.requests == 2 * wave
        assert upstream.connections == wave


def _ours(obj: object) -> bool:
    """Whether ``obj`` is the sidecar's: an instance of, or a function from, ``llmobs``."""
    module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    return isinstance(module, str) and module.startswith("llmobs")


async def test_a_relayed_request_leaves_no_reference_cycles(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """Every object of a finished request is freed by reference counting: cyclic garbage
    (a closure holding its own timer, say) waits for the collector, whose passes over
    everything young stall the loop for milliseconds under load (docs/benchmarks.md)."""
    sim = await start_sim(prefill_base=0.0, decode_base=0.0005, decode_per_seq=0.0)
    side = await start_sidecar(sim.url, **QUIET)
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm: pools, label sets, templates
            await post(session, side.url)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                status, _ = await post(session, side.url)
                assert status == 200
            await eventually(lambda: side.value("llmobs_requests_total") == 23)
            gc.collect()
            cyclic = [o for o in gc.garbage if _ours(o)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert cyclic == []


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


async def test_whole_chunks_go_on_as_they_came_and_others_are_re_framed(
    start_sidecar: SidecarFactory,
) -> None:
    """The engine's chunks reach the client byte for byte when the engine frames plainly
    (whatever the case of its hex), the last token and the last chunk in one piece as the
    engine sent them; extensions and trailers are not passed on (re-framed, strictly)."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n'
    events = [event % i for i in range(3)]
    plain = [b"%X\r\n%s\r\n" % (len(e), e) for e in events]  # upper-case hex sizes
    plain[-1] += b"0\r\n\r\n"  # the last token and the end of the body in one write
    odd = [b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events]
    odd[-1] += b"0\r\nX-Trailer: 1\r\n\r\n"

    async def respond(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(SSE_HEAD + b"\r\n")
        for piece in plain if n == 1 else odd:
            await asyncio.sleep(0.02)  # one read each
            writer.write(piece)
            await writer.drain()
        return True

    async def relayed(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps(BODY).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head
        return rest

    async with raw_upstream(respond) as (_, url):
        side = await start_sidecar(url, **QUIET)
        port = int(side.url.rsplit(":", 1)[1])
        assert await relayed(port) == b"".join(plain)
        reframed = await relayed(port)
        assert reframed == b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
        assert side.value("llmobs_requests_total", outcome="ok") == 2


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


async def test_a_transfer_coding_overrides_a_content_length(
    start_sidecar: SidecarFactory,
) -> None:
    """An engine that sends both framings: the chunked body is relayed without the length
    (a client counting 100 bytes would read the next response into this one), and the
    connection is not reused (RFC 9112 section 6.3)."""

    async def both(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"
        )
        await writer.drain()
        return True

    async with raw_upstream(both) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        port = int(side.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(2):  # two whole responses, each framed by its chunks alone
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert b"content-length" not in head.lower()
            assert b"Transfer-Encoding: chunked" in head
            body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
            assert body == b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"
        writer.close()
        assert upstream.connections == 2  # the first connection was not reused


async def test_garbage_from_the_engine_is_a_502(start_sidecar: SidecarFactory) -> None:
    async def garbage(writer: asyncio.StreamWriter, _: int) -> bool:
        writer.write(b"SSH-2.0-OpenSSH_9.0\r\n\r\n")
        await writer.drain()
        return False

    async with raw_upstream(garbage) as (_, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            status, body = await post(session, side.url)
        assert status == 502
        assert b"upstream sent an invalid response" in body
        assert side.value("llmobs_requests_total", outcome="upstream_error") == 1


@dataclass
class Flood:
    """An engine that streams ``total`` chunks of 65 kB as fast as the sidecar reads them,
    and notes how many it wrote and whether its connection was closed under it."""

    total: int
    silent: bool = False  # then neither end nor close until ``release``
    chunk: bytes = b"data: " + b"x" * 65_000 + b"\n\n"
    sent: int = 0
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, writer: asyncio.StreamWriter, _: int) -> bool:
        try:
            writer.write(SSE_HEAD + b"\r\n")
            for _ in range(self.total):
                writer.write(b"%x\r\n%s\r\n" % (len(self.chunk), self.chunk))
                await writer.drain()  # blocks while the sidecar does not read
                self.sent += 1
            if self.silent:
                await asyncio.wait_for(self.release.wait(), 30)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            self.cut.set()
            return False
        return True


async def slow_client(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client with a small receive buffer that has sent a streaming request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    return reader, writer


async def read_events(reader: asyncio.StreamReader, total: int) -> int:
    """Read until ``total`` whole events or the end. The body is decoded first (the sidecar
    re-frames partial reads, so chunk lines fall anywhere), and an event counts at its end:
    its head alone, or an end split across reads, is not miscounted."""
    await reader.readuntil(b"\r\n\r\n")  # the response head
    decoder = ChunkedBody()
    received, tail = 0, b""
    while received < total:
        data = await reader.read(1 << 20)
        if not data:
            break
        window = tail + decoder.feed(data)
        received += window.count(b"\n\n")
        tail = window[-1:]  # shorter than the mark: no mark is counted twice
    return received


async def test_a_client_that_does_not_read_pauses_the_engine(start_sidecar: SidecarFactory) -> None:
    """Back-pressure: the sidecar does not buffer what the client cannot take. While reads
    are paused for the client the engine is not silent: the read timeout (0.5 s here) does
    not run, and the stream goes on in full once the client reads again, 1.5 s later."""
    flood = Flood(total=512)  # 33 MB offered
    async with raw_upstream(flood) as (_, url):
        side = await start_sidecar(url, read_timeout=0.5, **QUIET)
        reader, writer = await slow_client(side.url)
        await asyncio.sleep(1.5)  # the client reads nothing meanwhile
        held = flood.sent
        assert held < flood.total / 2, (
            f"the engine wrote {held} of {flood.total} to a stalled client"
        )
        assert await read_events(reader, flood.total) == flood.total
        writer.close()
        await eventually(lambda: side.value("llmobs_requests_total", outcome="ok") == 1)
        assert side.value("llmobs_requests_total", outcome="upstream_timeout") == 0


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


async def test_a_client_that_half_closes_behind_a_full_buffer_frees_the_engine_at_once(
    start_sidecar: SidecarFactory,
) -> None:
    """A client's EOF ends its stream, as nginx takes it (a client that closed "prematurely").
    With its response backed up, the engine's reads are paused and no read would notice; the
    transport waits for a buffer that never drains. The EOF itself closes the engine's
    connection, long before the send timeout (30 s here) would."""
    flood = Flood(total=512)
    async with raw_upstream(flood) as (_, url):
        side = await start_sidecar(url, client_timeout=30, read_timeout=60, **QUIET)
        _reader, writer = await slow_client(side.url)
        await asyncio.sleep(0.75)  # the buffers on the way fill, and the engine is paused
        assert not flood.cut.is_set()
        writer.write_eof()
        await asyncio.wait_for(flood.cut.wait(), 5)
        await eventually(
            lambda: side.value("llmobs_requests_total", outcome="client_disconnect") == 1
        )
        writer.close()


async def test_a_client_that_leaves_as_its_response_ends_is_still_ok(
    start_sidecar: SidecarFactory,
) -> None:
    """The engine's last read and the client's EOF, ready in the same loop round, in that
    order: the client had the whole response, so the request is ``ok`` and the engine's
    connection goes back to the pool, as when the client leaves a round later."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    chunk = b"%x\r\n%b\r\n" % (len(event), event)
    engines: list[asyncio.StreamWriter] = []
    finished = asyncio.Event()

    async def respond(writer: asyncio.StreamWriter, n: int) -> bool:
        if n > 1:
            writer.write(SSE_HEAD + b"\r\n" + chunk + b"0\r\n\r\n")
            return True
        writer.write(SSE_HEAD + b"\r\n" + chunk)
        engines.append(writer)
        await finished.wait()
        return True

    async with raw_upstream(respond) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        body = json.dumps(BODY).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % len(body)
        ) + body
        reader, writer = await asyncio.open_connection("127.0.0.1", int(side.url.rsplit(":")[2]))
        writer.write(request)
        await reader.readuntil(b"\n\n")  # the head and the first event
        engines[0].write(chunk + b"0\r\n\r\n")  # the last read, then at once the EOF:
        writer.write_eof()  # no loop round between them
        finished.set()
        await eventually(lambda: side.value("llmobs_requests_total") == 1)
        assert side.value("llmobs_requests_total", outcome="ok") == 1
        writer.close()
        async with aiohttp.ClientSession() as session:
            status, _ = await post(session, side.url)
        assert status == 200
        assert upstream.connections == 1  # the first request's went back to the pool


async def test_a_client_gone_before_the_response_head_is_sent_nothing(
    start_sidecar: SidecarFactory,
) -> None:
    """A client resets while the engine is silent, and the engine's head (with a first
    token) comes in the loop round that runs the client's ``connection_lost``, before the
    handler's cancellation lands. Nothing of it is relayed or observed: the exchange ends
    there, the request is ``client_disconnect`` with no first token, and the engine's
    connection is closed."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    go = asyncio.Event()
    cut = asyncio.Event()

    async def respond(writer: asyncio.StreamWriter, _: int) -> bool:
        await go.wait()
        writer.write(SSE_HEAD + b"\r\n" + b"%x\r\n%b\r\n" % (len(event), event))
        with contextlib.suppress(ConnectionError):
            while True:  # until the sidecar closes the connection
                await asyncio.sleep(0.01)
                writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                await writer.drain()
        cut.set()
        return False

    async with raw_upstream(respond) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        body = json.dumps(BODY).encode()
        sock = socket.create_connection(("127.0.0.1", int(side.url.rsplit(":")[2])))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % len(body)
            + body
        )
        await eventually(lambda: upstream.requests == 1)
        # a reset now; the engine answers in the next round (the sidecar reads the reset in
        # that round too, after the engine's write, and runs connection_lost in the one after)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        go.set()
        await asyncio.wait_for(cut.wait(), 5)
        await eventually(lambda: side.value("llmobs_requests_total") == 1)
        assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1
        assert side.value("gen_ai_server_time_to_first_token_seconds_count") == 0


async def test_a_client_that_stops_reading_is_cut_off_after_the_client_timeout(
    start_sidecar: SidecarFactory,
) -> None:
    """A stalled reader cannot hold a stream, and the engine's slot, for ever: once it has
    taken nothing of its response for ``--client-timeout``, its connection is closed, the
    engine's with it, and the request ends as ``client_disconnect``."""
    flood = Flood(total=512)
    async with raw_upstream(flood) as (_, url):
        side = await start_sidecar(url, client_timeout=1.5, read_timeout=60, **QUIET)
        reader, writer = await slow_client(side.url)
        await asyncio.sleep(0.75)  # paused, and not for long enough
        assert not flood.cut.is_set()
        assert side.value("llmobs_requests_total", outcome="client_disconnect") == 0
        await asyncio.wait_for(flood.cut.wait(), 15)
        assert flood.sent < flood.total / 2
        await eventually(
            lambda: side.value("llmobs_requests_total", outcome="client_disconnect") == 1
        )
        with contextlib.suppress(ConnectionError):
            assert await read_events(reader, flood.total) < flood.total  # cut short
        writer.close()


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop not installed")
async def test_the_cli_serves_on_uvloop(start_sim: SimFactory) -> None:
    sim = await start_sim()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mport = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", "serve", "--upstream", sim.url, "--host", "127.0.0.1",
        "--port", str(port), "--metrics-host", "127.0.0.1", "--metrics-port", str(mport),
        "--event-loop", "uvloop", "--log-level", "debug", "--engine-scrape-interval", "0",
        "--gpu-sample-interval", "0", cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{mport}/healthz") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.1)
            statuses = await asyncio.gather(
                *(post(session, f"http://127.0.0.1:{port}") for _ in range(8))
            )
            assert all(s == 200 and b.endswith(b"data: [DONE]\n\n") for s, b in statuses)
            async with session.get(f"http://127.0.0.1:{mport}/metrics") as r:
                text = await r.text()
        ok = [
            line for line in text.splitlines()
            if line.startswith("llmobs_requests_total{") and 'outcome="ok"' in line
        ]  # fmt: skip
        assert sum(float(line.rsplit(" ", 1)[1]) for line in ok) == 8
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert b"event loop: uvloop" in err


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop not installed")
def test_clients_that_vanish_mid_stream_on_uvloop() -> None:
    """On uvloop a transport is dead once its ``connection_lost`` has run: a write to it
    raises. The handler's cancellation lands a loop round later, and an engine that streams
    can deliver a read in between. So the relay stops relaying when the client goes
    (``Request.on_gone``) rather than write into a dead transport, whose error would reach
    the loop's exception handler and cut the engine's connection uncleanly. 20 clients reset
    their connections while an engine writes a token every loop round."""
    uvloop = pytest.importorskip("uvloop")
    event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    chunk = b"%x\r\n%b\r\n" % (len(event), event)
    clients = 20

    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        ended = 0

        async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal ended
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(SSE_HEAD + b"\r\n")
            try:
                while not writer.transport.is_closing():
                    writer.write(chunk)
                    await asyncio.sleep(0)  # a token every loop round
            finally:
                ended += 1

        server = await asyncio.start_server(engine, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = Settings(
            upstream=f"http://127.0.0.1:{port}", host="127.0.0.1", port=0,
            metrics_host="127.0.0.1", metrics_port=0, engine_scrape_interval=0,
            gpu_sample_interval=0,
        )  # fmt: skip
        telemetry = build_telemetry()
        sidecar = Sidecar(settings, telemetry)
        await sidecar.start()
        side = SidecarHandle("", "", telemetry.registry, sidecar)
        body = json.dumps(BODY).encode()
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        try:
            for n in range(1, clients + 1):
                reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.port)
                writer.write(request)
                await reader.readuntil(b"\r\n\r\n")
                for _ in range(3):
                    await reader.readuntil(b"\n\n")
                writer.transport.abort()  # a reset, with the stream in full flow
                await eventually(lambda: side.value("llmobs_requests_total") == n)  # noqa: B023
                await eventually(lambda: ended == n)  # noqa: B023  # the engine saw it end
            assert errors == []
            assert side.value("llmobs_requests_total", outcome="client_disconnect") == clients
        finally:
            await sidecar.stop()
            server.close()

    uvloop.run(main())


async def test_closing_a_connection_mid_body_ends_it_at_once() -> None:
    """A graceful close waits for the write buffer to drain, and an engine that reads
    nothing more never drains it: the socket would be held, the engine never told. A close
    with a request not wholly sent therefore aborts (the relay closes a connection whose
    client went away, mid-stream), and the exchange ends long before its read timeout."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head only: the body is never read
        writer.write(SSE_HEAD + b"\r\n")
        await asyncio.sleep(0.3)  # the chunk comes while the relay waits for the body
        writer.write(b"5\r\nhello\r\n")
        await writer.drain()
        await finished.wait()
        writer.transport.abort()

    finished = asyncio.Event()
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream(f"http://127.0.0.1:{port}", 1.0, 4.0)
    try:
        conn, _ = await upstream.acquire()
        body = b"x" * (16 << 20)  # far more than the socket buffers hold
        head = upstream.request_head("POST", "/v1/chat/completions", [], body)
        heads: list[int] = []

        def on_head(c: Connection, response: ResponseHead) -> OnBody:
            heads.append(response.status)
            return lambda payload, frame, last: c.close()  # the client went away

        conn.send("POST", head, body, on_head)  # more than the engine will ever read
        start = asyncio.get_running_loop().time()
        with pytest.raises(ConnectionError):  # aborted: not the read timeout's TimeoutError
            await asyncio.wait_for(conn.wait(30.0), 10.0)
        assert heads == [200]
        assert asyncio.get_running_loop().time() - start < 5.0
        assert conn.closed  # the socket is gone, not waiting to drain
    finally:
        finished.set()
        upstream.close()
        server.close()
        await asyncio.sleep(0.05)
