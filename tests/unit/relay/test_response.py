"""The engine's response on its way to the client (``relay/response.py``): its head passed on
with its own headers (hop-by-hop ones aside) and a length only where the body keeps it; each
read written first, whole chunks as they came, others re-framed, then observed; the engine
paused while the client does not read; the client's going closing the engine's connection,
unless the response had ended; a client gone before the head sent nothing."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import struct
from typing import Any

import aiohttp
import pytest

from llmobs.app import Sidecar
from llmobs.config.settings import Settings
from llmobs.export.telemetry import build_telemetry
from llmobs.relay.inject import UsageStripper
from llmobs.relay.observing import NULL_OBSERVER, NullObserver
from llmobs.relay.response import ResponseRelay, _length
from llmobs.wire.http1 import parse_response_head
from llmobs.wire.server import Request
from llmobs.wire.upstream import Upstream
from tests.support.backpressure import Flood, read_events, slow_client
from tests.support.protocol_server import serving
from tests.support.rawhttp import WAIT, Response, get, read_response
from tests.support.servers import SidecarFactory, SidecarHandle, eventually
from tests.support.upstreams import BODY, SSE_HEAD, post, raw_upstream

QUIET = {"engine_scrape_interval": 0, "gpu_sample_interval": 0}


class Told(NullObserver):
    """What the relay told observation: the response's status and type, and each read."""

    def __init__(self) -> None:
        self.responses: list[tuple[int, str]] = []
        self.chunks: list[bytes] = []

    def response(self, status: int, content_type: str, encoding: str = "") -> None:
        self.responses.append((status, content_type))

    def chunk(self, t_ns: int, data: bytes) -> None:
        self.chunks.append(data)


async def relayed(reply: bytes, stripper: UsageStripper | None = None) -> tuple[Response, Told]:
    """``reply``, a scripted engine's, relayed to a client by a ``ResponseRelay`` alone (the
    exchange's other steps left out): what the client read, and what observation was told."""
    told = Told()

    async def respond(writer: asyncio.StreamWriter, _: int) -> bool:
        writer.write(reply)
        await writer.drain()
        return True

    async with raw_upstream(respond) as (_, url), serving() as serve:
        upstream = Upstream(url, WAIT, 4.0)

        async def handle(request: Request) -> None:
            stream = ResponseRelay(request, told, stripper, set())
            conn, _ = await upstream.acquire()
            head = upstream.request_head("GET", request.target, [], None)
            conn.send("GET", head, b"", stream.on_head)
            await conn.wait(WAIT)
            request.end()
            upstream.release(conn)

        served = await serve(handle)
        client = await served.connect()
        await client.send(get("/v1/models"))
        response = await read_response(client.reader)
        upstream.close()
    return response, told


# -- the head -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "observed"),
    [("", "application/json"), ("Content-Encoding: identity\r\n", "application/json"),
     ("Content-Encoding: gzip\r\n", "")],
    ids=["plain", "identity", "gzip"],
)  # fmt: skip
async def test_the_head_goes_on_with_the_engines_own_headers(encoding: str, observed: str) -> None:
    """Hop-by-hop headers and those ``Connection`` names stop here; the rest go on, and the
    length with them. Observation is told the type, unless the body is compressed: relayed
    and timed then, not parsed (so not malformed)."""
    reply = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5\r\n"
        f"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Request-Id: r1\r\n{encoding}"
        "Content-Length: 3\r\n\r\nabc"
    ).encode()
    response, told = await relayed(reply)
    names = [name for name, _ in response.headers]
    assert {"Keep-Alive", "Connection", "X-Hop"}.isdisjoint(names)
    assert (response.header("X-Request-Id"), response.header("Content-Length")) == ("r1", "3")
    assert (response.body, told.responses, told.chunks) == (b"abc", [(200, observed)], [b"abc"])


async def test_a_response_no_stream_keeps_its_body_and_length_from_the_usage_stripper() -> None:
    """``--inject-usage`` rewrites event streams only: an engine's JSON error goes on as it
    came, with its length."""
    error = json.dumps({"error": {"message": "no", "usage": {"total_tokens": 1}}}).encode()
    reply = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
    reply += b"Content-Length: %d\r\n\r\n%b" % (len(error), error)
    response, _ = await relayed(reply, UsageStripper())
    assert (response.status, response.body) == (400, error)
    assert response.header("Content-Length") == str(len(error))


def test_a_rewritten_or_transfer_coded_body_drops_the_engines_length() -> None:
    plain = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 42")
    chunked = parse_response_head(
        b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\nTransfer-Encoding: chunked"
    )
    assert _length(plain, None) == 42
    assert _length(chunked, None) is None  # RFC 9112 6.3: the coding wins
    assert _length(plain, UsageStripper()) is None  # the body is rewritten


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


async def test_observation_starts_when_the_request_is_first_sent_only() -> None:
    """``sent`` starts observation the first time the request is handed to a connection; a
    retry hands it on again, and starts nothing."""
    told: list[object] = []

    async def handle(request: Request) -> None:
        stream = ResponseRelay(request, NULL_OBSERVER, None, set(), lambda: told.append(1))
        bare = ResponseRelay(request, NULL_OBSERVER, None, set())
        unsent = [stream.unsent]
        stream.sent()
        stream.sent()  # a retry
        request.respond(200, json.dumps([*unsent, stream.unsent, bare.unsent]).encode())

    async with serving() as serve:
        served = await serve(handle)
        client = await served.connect()
        await client.send(get("/"))
        assert json.loads((await read_response(client.reader)).body) == [True, False, False]
    assert told == [1]


# -- the body -------------------------------------------------------------------------------


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


# -- the client going away ------------------------------------------------------------------


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
