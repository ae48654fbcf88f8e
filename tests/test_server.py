"""The client leg's HTTP/1.1 server over loopback: raw bytes in, raw bytes out.

Keep-alive, pipelining, request bodies (length, chunked, 100-continue, too large, too slow),
HTTP/1.0 and HEAD framing, malformed heads, handlers that fail or leave a response unfinished,
client disconnects, idle and slowloris timeouts, graceful shutdown and back-pressure. The
handlers are small test ones: the server takes any ``async def handler(request)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import socket
import struct
import sys
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from llmobs.http1 import MAX_REQUEST_HEAD_BYTES, MAX_TRAILER_BYTES, BadRequest
from llmobs.server import (
    HIGH_WATER,
    LOW_WATER,
    BodyTooLarge,
    BodyTooSlow,
    ProxyServer,
    Request,
    error_body,
)
from tests.conftest import eventually, loop_turns

WAIT = 5.0  # the bound on any single wait: generous, for a shared 2-core machine
MAX_BODY = 1024
Handler = Callable[[Request], Awaitable[None]]


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(values) <= 1, f"{name} repeated: {values}"
        return values[0] if values else None


async def read_head(reader: asyncio.StreamReader) -> tuple[int, str, list[tuple[str, str]]]:
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = raw[:-4].decode("latin-1").split("\r\n")
    version, status, reason = lines[0].split(" ", 2)
    assert version == "HTTP/1.1"
    fields = [line.partition(":") for line in lines[1:]]
    return int(status), reason, [(k, v.strip()) for k, _, v in fields]


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT)
        size = int(line[:-2], 16)
        chunk = await asyncio.wait_for(reader.readexactly(size + 2), WAIT)
        assert chunk.endswith(b"\r\n")
        body += chunk[:-2]
        if not size:
            return bytes(body)


async def read_response(reader: asyncio.StreamReader, *, head_only: bool = False) -> Response:
    """One response, framed as its head says (a HEAD's: the head alone)."""
    status, reason, headers = await read_head(reader)
    response = Response(status, reason, headers, b"")
    if head_only or status in (100, 204, 304):
        return response
    length = response.header("Content-Length")
    if length is not None:
        response.body = await asyncio.wait_for(reader.readexactly(int(length)), WAIT)
    elif response.header("Transfer-Encoding") == "chunked":
        response.body = await read_chunked(reader)
    else:
        response.body = await read_to_eof(reader)
    return response


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes (a reset counts as a close)."""
    out = bytearray()
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), WAIT):
            out += chunk
    return bytes(out)


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection with nothing more said."""
    return await read_to_eof(reader) == b""


@dataclass
class Client:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await asyncio.wait_for(self.writer.drain(), WAIT)


@dataclass
class Served:
    server: ProxyServer
    port: int
    clients: list[Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def connect(self, sock: socket.socket | None = None) -> Client:
        if sock is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        else:
            reader, writer = await asyncio.open_connection(sock=sock)
        client = Client(reader, writer)
        self.clients.append(client)
        return client


ServeFactory = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve() -> AsyncIterator[ServeFactory]:
    """``await serve(handler, client_timeout=..., max_body=...)``: a ProxyServer on loopback,
    shut down (and its clients closed) when the test ends."""
    async with serving() as start:
        yield start


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[ServeFactory]:
    started: list[Served] = []

    async def start(
        handler: Handler, *, client_timeout: float = 10.0, max_body: int = MAX_BODY
    ) -> Served:
        server = ProxyServer(handler, client_timeout=client_timeout, max_body=max_body)
        port = await server.listen("127.0.0.1", 0)
        served = Served(server, port)
        started.append(served)
        return served

    yield start
    for served in started:
        for client in served.clients:
            client.writer.transport.abort()
        await served.server.shutdown(0.5)
        assert not served.server.connections


@dataclass
class Seen:
    """What the test handlers saw and how they ended."""

    requests: list[Request] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    errors: list[BaseException] = field(default_factory=list)

    @property
    def targets(self) -> list[str]:
        return [r.target for r in self.requests]


def echo(seen: Seen, budget: float = WAIT) -> Handler:
    """Reads the body, answers ``METHOD target`` and the body; errors as 413/408/400 (without
    asking for the connection to be closed: the server must know when it has to)."""

    async def handle(request: Request) -> None:
        seen.requests.append(request)
        seen.started.set()
        try:
            body = await request.read_body(budget)
        except (BodyTooLarge, BodyTooSlow, BadRequest) as exc:
            seen.errors.append(exc)
            status = {BodyTooLarge: 413, BodyTooSlow: 408}.get(type(exc), 400)
            request.respond(status, error_body(status, type(exc).__name__))
            return
        line = f"{request.method} {request.target}\n".encode()
        request.respond(200, line + body, "text/plain")

    return handle


def streaming(seen: Seen, parts: list[bytes]) -> Handler:
    """An event stream written part by part with ``begin``/``write``/``end``."""

    async def handle(request: Request) -> None:
        seen.requests.append(request)
        request.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
        for part in parts:
            request.write(part)
            await asyncio.sleep(0)
        request.end()

    return handle


def blocked(seen: Seen, release: asyncio.Event) -> Handler:
    """Waits for ``release`` before answering; notes its cancellation."""

    async def handle(request: Request) -> None:
        seen.requests.append(request)
        seen.started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            seen.cancelled.set()
            raise
        request.respond(200, b"released", "text/plain")

    return handle


def get(target: str = "/", *extra: str, version: str = "HTTP/1.1") -> bytes:
    lines = [f"GET {target} {version}", "Host: test", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def post(target: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {target} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


# -- requests, keep-alive, pipelining -------------------------------------------------------


async def test_the_handler_sees_the_request_as_sent(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: test\r\nX-Tag: a\r\n"
        b"x-tag: b\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello"
    )
    response = await read_response(client.reader)
    assert response.status == 200
    assert response.body == b"POST /v1/chat/completions?x=1\nhello"
    assert response.header("Content-Type") == "text/plain"
    assert response.header("Content-Length") == str(len(response.body))
    assert response.header("Connection") is None  # HTTP/1.1: kept alive, nothing to say
    assert response.header("Date") is not None
    (request,) = seen.requests
    assert (request.method, request.path, request.remote) == (
        "POST",
        "/v1/chat/completions",
        "127.0.0.1",
    )
    assert request.headers.getall("X-Tag") == ["a", "b"]
    assert request.has_body
    assert request.content_length == 5


async def test_respond_200_has_the_reason_ok(serve: ServeFactory) -> None:
    """``respond`` takes the reason from ``REASONS``, which lists only error statuses: a 200
    goes out as "HTTP/1.1 200 Error"."""
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(get("/"))
    response = await read_response(client.reader)
    assert (response.status, response.reason) == (200, "OK")


async def test_keep_alive_answers_two_requests_on_one_connection(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    for i in range(2):
        await client.send(post(f"/r{i}", b"body%d" % i))
        response = await read_response(client.reader)
        assert (response.status, response.body) == (200, b"POST /r%d\nbody%d" % (i, i))
    assert seen.targets == ["/r0", "/r1"]
    assert len(served.server.connections) == 1


async def test_keep_alive_with_an_aiohttp_client_reuses_its_connection(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(3):
            async with session.post(f"{served.url}/c{i}", data=b"x" * i) as r:
                assert r.status == 200
                assert await r.read() == b"POST /c%d\n" % i + b"x" * i
    assert len({id(r.transport) for r in seen.requests}) == 1


async def test_pipelined_requests_are_answered_in_order(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(post("/1", b"one") + get("/2") + post("/3", b"three"))
    bodies = [(await read_response(client.reader)).body for _ in range(3)]
    assert bodies == [b"POST /1\none", b"GET /2\n", b"POST /3\nthree"]
    assert seen.targets == ["/1", "/2", "/3"]


async def test_a_flood_of_pipelined_requests_pauses_reading_until_answered(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    release = asyncio.Event()
    served = await serve(blocked(seen, release))
    client = await served.connect()
    pad = "X-Pad: " + "p" * 1024
    flood = b"".join(get(f"/{i}", pad) for i in range(300))  # over MAX_PIPELINED
    await client.send(flood)
    await asyncio.wait_for(seen.started.wait(), WAIT)
    transport = seen.requests[0].transport
    await eventually(lambda: not transport.is_reading())
    release.set()
    for _ in range(300):
        assert (await read_response(client.reader)).body == b"released"
    assert seen.targets == [f"/{i}" for i in range(300)]
    assert transport.is_reading()


async def test_a_body_behind_a_flood_of_pipelined_requests_is_still_read(
    serve: ServeFactory,
) -> None:
    """Reading resumes once the pipelined bytes run low, or for a body still to come: a
    request whose head was buffered behind a flood gets the rest of its body read."""
    seen = Seen()
    release = asyncio.Event()
    served = await serve(echo(seen))
    client = await served.connect()
    pad = "X-Pad: " + "p" * 1024
    flood = b"".join(get(f"/{i}", pad) for i in range(300))  # over MAX_PIPELINED
    body = b"b" * 600
    await client.send(flood + post("/last", body)[:-300])
    for i in range(300):
        assert (await read_response(client.reader)).body == f"GET /{i}\n".encode()
    await asyncio.sleep(0.05)
    await client.send(body[-300:])
    assert (await read_response(client.reader)).body == b"POST /last\n" + body
    assert not release.is_set()


async def test_stray_crlf_between_requests_is_ignored(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(post("/1", b"one") + b"\r\n" + get("/2"))
    assert (await read_response(client.reader)).body == b"POST /1\none"
    assert (await read_response(client.reader)).body == b"GET /2\n"


# -- request bodies -------------------------------------------------------------------------


async def test_a_chunked_body_split_over_several_writes_is_read_whole(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    wire = chunked(b"hello ", b"chunked ", b"world")
    await client.send(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    await asyncio.wait_for(seen.started.wait(), WAIT)  # the handler waits for the body
    for i in range(0, len(wire), 7):
        await client.send(wire[i : i + 7])
    response = await read_response(client.reader)
    assert (response.status, response.body) == (200, b"POST /c\nhello chunked world")
    await client.send(get("/after"))  # the connection is still in sync
    assert (await read_response(client.reader)).body == b"GET /after\n"


CHUNKED_HEAD = b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"


def tiny_chunks(count: int) -> bytes:
    return b"1\r\nx\r\n" * count


async def test_a_body_of_tiny_chunks_is_decoded_over_many_loop_turns(serve: ServeFactory) -> None:
    """The probe's upload: a body that is all framing. Its reads are decoded a share per loop
    turn (``http1.FEED_BUDGET`` chunks), so that the loop serves the other connections in
    between; decoded in the read callback whole, 50,000 chunks took a turn or two."""
    count = 50_000
    seen = Seen()
    served = await serve(echo(seen), max_body=1 << 20)
    client = await served.connect()
    async with loop_turns() as turns:
        await client.send(CHUNKED_HEAD + tiny_chunks(count) + b"0\r\n\r\n")
        response = await read_response(client.reader)
    assert (response.status, response.body) == (200, b"POST /up\n" + b"x" * count)
    assert turns.count >= count // 256 // 2, turns  # ~195 shares; a turn or two before
    await client.send(get("/after"))  # in sync: the next request is read after the body
    assert (await read_response(client.reader)).body == b"GET /after\n"


async def test_the_body_limit_counts_the_framing(serve: ServeFactory) -> None:
    """``--max-body-bytes`` bounds the body as it comes over the wire: 600 bytes of payload in
    1-byte chunks are 3,600 bytes to read (the probe sent 100 MB for 16 MiB of payload)."""
    seen = Seen()
    served = await serve(echo(seen), max_body=1000)
    client = await served.connect()
    await client.send(CHUNKED_HEAD + tiny_chunks(600) + b"0\r\n\r\n")
    assert (await read_response(client.reader)).status == 413
    assert [type(e) for e in seen.errors] == [BodyTooLarge]
    client = await served.connect()  # the framing of a body that fits counts, and fits
    await client.send(CHUNKED_HEAD + chunked(b"y" * 900))
    assert (await read_response(client.reader)).body == b"POST /up\n" + b"y" * 900


async def test_a_trailer_section_over_its_limit_is_431(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), max_body=1 << 20)
    client = await served.connect()
    trailers = b"X:y\r\n" * (MAX_TRAILER_BYTES // 5 + 1)
    await client.send(CHUNKED_HEAD + b"1\r\nx\r\n0\r\n" + trailers + b"\r\n")
    assert (await read_response(client.reader)).status == 400  # the test handler's mapping
    assert [type(e) for e in seen.errors] == [BadRequest]
    error = seen.errors[0]
    assert isinstance(error, BadRequest)
    assert error.status == 431  # what the relay answers (tests/test_hostile.py)
    assert "trailer" in str(error)


async def test_a_chunk_extension_over_the_line_limit_is_400(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), max_body=1 << 20)
    client = await served.connect()
    await client.send(CHUNKED_HEAD + b"1;a=" + b"b" * 100_000 + b"\r\nx\r\n0\r\n\r\n")
    assert (await read_response(client.reader)).status == 400
    assert [type(e) for e in seen.errors] == [BadRequest]


async def test_connect_is_answered_405_with_allow(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(b"CONNECT engine:443 HTTP/1.1\r\nHost: engine:443\r\n\r\n")
    response = await read_response(client.reader)
    assert response.status == 405
    assert "POST" in (response.header("Allow") or "")
    assert await closed(client.reader)
    assert seen.requests == []


async def test_a_path_climbing_above_the_root_is_400(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(get("/v1/%2e%2e/../admin"))
    assert (await read_response(client.reader)).status == 400
    assert seen.requests == []


async def test_expect_100_continue_is_answered_when_the_handler_reads(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    head = post("/e", b"", "Expect: 100-continue").replace(b"Length: 0", b"Length: 4")
    await client.send(head)
    interim = await read_response(client.reader)
    assert (interim.status, interim.reason, interim.headers) == (100, "Continue", [])
    await client.send(b"body")
    response = await read_response(client.reader)
    assert (response.status, response.body) == (200, b"POST /e\nbody")


async def test_no_100_continue_for_http_1_0(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(b"POST /e HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody")
    response = await read_response(client.reader)  # the final one, first
    assert (response.status, response.body) == (200, b"POST /e\nbody")


async def test_a_handler_that_answers_on_the_head_alone_sends_no_100(
    serve: ServeFactory,
) -> None:
    async def refuse(request: Request) -> None:
        request.respond(413, error_body(413, "too large"), close=True)

    served = await serve(refuse)
    client = await served.connect()
    await client.send(post("/e", b"", "Expect: 100-continue").replace(b"th: 0", b"th: 99"))
    response = await read_response(client.reader)
    assert response.status == 413
    assert response.header("Connection") == "close"
    assert await closed(client.reader)


async def test_a_refusal_reaches_a_client_still_sending_its_body(serve: ServeFactory) -> None:
    """The server answers 413 on the head and closes while the client goes on sending the
    body. A plain close with unread bytes makes the kernel reset the connection, and a reset
    discards the answer the client has not read yet; the lingering close (answer, FIN, drain)
    keeps it readable."""

    async def refuse(request: Request) -> None:
        request.respond(413, error_body(413, "too large"), close=True)

    served = await serve(refuse)
    client = await served.connect()
    size = 4 * 1024 * 1024
    await client.send(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
    await asyncio.sleep(0.2)  # the answer is on its way, the server has closed its side
    with contextlib.suppress(ConnectionError):
        for _ in range(16):  # the body goes on: 4 MiB in 256 KiB writes
            await client.send(b"x" * (256 * 1024))
    response = await read_response(client.reader)
    assert response.status == 413
    assert json.loads(response.body)["error"]["code"] == 413


async def test_a_response_sent_before_the_body_says_connection_close(
    serve: ServeFactory,
) -> None:
    """The handler answers on the head alone, without ``close=True``: the server closes the
    connection (the body was never read) but its response does not say so (RFC 9110 10.1.1:
    SHOULD say whether it closes or reads on), so the client may still send the body."""

    async def refuse(request: Request) -> None:
        request.respond(413, error_body(413, "too large"))

    served = await serve(refuse)
    client = await served.connect()
    await client.send(post("/e", b"", "Expect: 100-continue").replace(b"th: 0", b"th: 99"))
    response = await read_response(client.reader)
    assert response.status == 413
    assert await closed(client.reader)
    assert response.header("Connection") == "close"


async def test_a_body_over_max_body_raises_body_too_large(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), max_body=100)
    client = await served.connect()
    await client.send(post("/big", b"x" * 101))
    response = await read_response(client.reader)
    assert response.status == 413
    assert [type(e) for e in seen.errors] == [BodyTooLarge]


async def test_a_chunked_body_over_max_body_raises_body_too_large(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), max_body=100)
    client = await served.connect()
    head = b"POST /big HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    await client.send(head + chunked(b"x" * 60, b"y" * 60))
    assert (await read_response(client.reader)).status == 413
    assert [type(e) for e in seen.errors] == [BodyTooLarge]


async def test_a_body_of_exactly_max_body_is_accepted(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), max_body=100)
    client = await served.connect()
    await client.send(post("/fits", b"x" * 100))
    response = await read_response(client.reader)
    assert (response.status, response.body) == (200, b"POST /fits\n" + b"x" * 100)


@pytest.mark.parametrize(
    ("head", "first"),
    [
        (b"Content-Length: %d", b"x" * 101),  # too large: the rest is still body
        (b"Transfer-Encoding: chunked", b"zz\r\n"),  # broken framing: no telling where it ends
    ],
    ids=["too-large", "bad-chunk"],
)
async def test_the_rest_of_a_refused_body_is_never_parsed_as_a_request(
    serve: ServeFactory, head: bytes, first: bytes
) -> None:
    """After BodyTooLarge (or a broken chunked body) the server cannot know where the body
    ends, so the connection must close after the response, whatever the handler asked. Here
    the handler answers without ``close=True`` (as ``echo`` does) and the rest of the body,
    which looks like a request, is parsed and handled: request smuggling. The relay passes
    ``close=True`` today, so it is latent there; the server should not depend on it."""
    seen = Seen()
    served = await serve(echo(seen), max_body=100, client_timeout=1.0)  # ends a kept one
    client = await served.connect()
    smuggled = get("/smuggled")
    if b"%d" in head:
        head %= len(first) + len(smuggled)
    await client.send(b"POST /refused HTTP/1.1\r\nHost: t\r\n" + head + b"\r\n\r\n" + first)
    assert (await read_response(client.reader)).status in (400, 413)
    with contextlib.suppress(ConnectionError):
        await client.send(smuggled)
    after = await read_to_eof(client.reader)
    assert seen.targets == ["/refused"]
    assert after == b""


async def test_http_1_0_with_transfer_encoding_closes_the_connection(
    serve: ServeFactory,
) -> None:
    """RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding MUST be treated as having
    faulty framing and the connection closed after it (an HTTP/1.0 front proxy may not
    know chunked, and would see a different body). Here it is kept alive on request."""
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(
        b"POST /te HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(b"abc")
    )
    response = await read_response(client.reader)
    assert response.status in (200, 400)
    assert response.header("Connection") == "close"
    assert await closed(client.reader)


async def test_a_slow_body_raises_body_too_slow_after_the_budget(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen, budget=0.3))
    client = await served.connect()
    loop = asyncio.get_running_loop()
    start = loop.time()
    await client.send(post("/slow", b"0123456789")[:-7])  # 3 of 10 bytes
    response = await read_response(client.reader)
    elapsed = loop.time() - start
    assert response.status == 408
    assert [type(e) for e in seen.errors] == [BodyTooSlow]
    assert 0.2 < elapsed < WAIT
    assert await closed(client.reader)  # the body never ended: the stream is out of sync


# -- response framing -----------------------------------------------------------------------


async def test_a_streamed_response_is_chunked_on_http_1_1(serve: ServeFactory) -> None:
    seen = Seen()
    parts = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    served = await serve(streaming(seen, parts))
    client = await served.connect()
    await client.send(get("/s") + get("/s2"))
    for _ in range(2):
        response = await read_response(client.reader)
        assert response.header("Transfer-Encoding") == "chunked"
        assert response.header("Content-Type") == "text/event-stream"
        assert response.header("Connection") is None
        assert response.body == b"".join(parts)


@pytest.mark.parametrize("connection", [[], ["Connection: keep-alive"]])
async def test_http_1_0_streaming_is_unframed_and_ends_with_the_connection(
    serve: ServeFactory, connection: list[str]
) -> None:
    seen = Seen()
    parts = [b"data: 1\n\n", b"data: 2\n\n"]
    served = await serve(streaming(seen, parts))
    client = await served.connect()
    await client.send(get("/s", *connection, version="HTTP/1.0"))
    response = await read_response(client.reader)  # no length, not chunked: until close
    assert response.status == 200
    assert response.header("Transfer-Encoding") is None
    assert response.header("Content-Length") is None
    assert response.header("Connection") == "close"
    assert response.body == b"".join(parts)


async def test_http_1_0_keep_alive_with_a_length_keeps_the_connection(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    for i in range(2):
        await client.send(get(f"/k{i}", "Connection: keep-alive", version="HTTP/1.0"))
        response = await read_response(client.reader)
        assert response.header("Connection") == "keep-alive"
        assert response.body == b"GET /k%d\n" % i
    await client.send(get("/last", version="HTTP/1.0"))
    response = await read_response(client.reader)
    assert response.header("Connection") == "close"
    assert await closed(client.reader)


async def test_connection_close_from_the_client_is_honoured(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(get("/a", "Connection: close") + get("/never"))
    response = await read_response(client.reader)
    assert response.header("Connection") == "close"
    assert await closed(client.reader)
    assert seen.targets == ["/a"]


@pytest.mark.parametrize("kind", ["respond", "streaming"])
async def test_head_gets_no_body(serve: ServeFactory, kind: str) -> None:
    """A HEAD response ends with its head; a body after it would be read as the next
    response. Checked by a GET that follows on the same connection."""
    seen = Seen()
    handler = echo(seen) if kind == "respond" else streaming(seen, [b"data: 1\n\n"])
    served = await serve(handler)
    client = await served.connect()
    await client.send(get("/h").replace(b"GET", b"HEAD", 1))
    status, _, headers = await read_head(client.reader)
    assert status == 200
    if kind == "respond":
        assert ("Content-Length", str(len(b"HEAD /h\n"))) in headers
    await client.send(get("/g"))
    response = await read_response(client.reader)
    assert response.status == 200
    assert response.body in (b"GET /g\n", b"data: 1\n\n")


# -- malformed requests ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\nBad Name: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-A: one\r\n two\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\n" + b"X-H: v\r\n" * 200 + b"\r\n", 431),
    ],
)
async def test_a_malformed_head_gets_a_json_error_and_a_close(
    serve: ServeFactory, raw: bytes, status: int
) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(raw)
    response = await read_response(client.reader)
    assert response.status == status
    assert response.header("Connection") == "close"
    assert response.header("Content-Type") == "application/json"
    error = json.loads(response.body)["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == status
    assert isinstance(error["message"], str)
    assert isinstance(error["type"], str)
    assert await closed(client.reader)
    assert seen.requests == []


async def test_a_malformed_pipelined_request_is_refused_after_the_good_one(
    serve: ServeFactory,
) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(get("/ok") + b"GET / HTTP/1.1\r\nX-A : b\r\n\r\n" + get("/never"))
    assert (await read_response(client.reader)).status == 200
    assert (await read_response(client.reader)).status == 400
    assert await closed(client.reader)
    assert seen.targets == ["/ok"]


async def test_a_head_over_the_limit_is_431_and_closed(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    big = "X-Big: " + "a" * MAX_REQUEST_HEAD_BYTES
    await client.send(get("/", big))
    response = await read_response(client.reader)
    assert response.status == 431
    assert response.header("Connection") == "close"
    assert await closed(client.reader)
    assert seen.requests == []


async def test_an_unterminated_head_over_the_limit_is_431(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * MAX_REQUEST_HEAD_BYTES)
    assert (await read_response(client.reader)).status == 431
    assert await closed(client.reader)


async def test_a_head_at_the_limit_is_accepted_however_it_is_split(
    serve: ServeFactory,
) -> None:
    """A head of exactly MAX_REQUEST_HEAD_BYTES is accepted when its blank line comes with
    it, but refused (431) when a read ends inside the final CRLFCRLF: the limit is checked
    against the buffer, blank line included. The pause forces the split (nothing to await:
    it is the client's own timing being simulated)."""
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    start = b"GET /limit HTTP/1.1\r\nX-Pad: "
    head = start + b"a" * (MAX_REQUEST_HEAD_BYTES - len(start))
    assert len(head) == MAX_REQUEST_HEAD_BYTES
    await client.send(head + b"\r\n")
    await asyncio.sleep(0.2)
    with contextlib.suppress(ConnectionError):
        await client.send(b"\r\n")
    response = await read_response(client.reader)
    assert response.status == 200


async def test_a_target_with_a_bare_lf_never_reaches_the_handler(
    serve: ServeFactory,
) -> None:
    """The relay writes the target verbatim into the engine's request line: a bare LF in it
    would be a header injected into the upstream request."""
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(b"GET /v1/models\nX-Injected:\tyes HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await read_response(client.reader)).status == 400
    assert seen.requests == []


async def test_a_non_ascii_digit_content_length_gets_a_400(serve: ServeFactory) -> None:
    """``Content-Length: \\xb2`` ("²": ``str.isdigit`` but not ``int``): a ValueError escapes
    ``data_received``, asyncio drops the connection and the client gets no answer."""
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: \xb2\r\n\r\n")
    assert await read_to_eof(client.reader) != b"", "closed without a response"
    assert seen.requests == []


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


async def test_abort_closes_the_connection_at_once(serve: ServeFactory) -> None:
    async def abort(request: Request) -> None:
        request.begin(200, "OK", [], 100)
        request.write(b"partial")
        request.abort()

    served = await serve(abort)
    client = await served.connect()
    await client.send(get("/abort") + get("/never"))
    status, _, _ = await read_head(client.reader)
    assert status == 200
    assert await read_to_eof(client.reader) == b"partial"


async def test_a_cut_response_is_an_error_for_an_http_client(serve: ServeFactory) -> None:
    async def unfinished(request: Request) -> None:
        request.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
        request.write(b"data: 1\n\n")

    served = await serve(unfinished)
    async with aiohttp.ClientSession() as session, session.get(served.url + "/cut") as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()


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


# -- the same, on uvloop (the relay's loop where installed) ---------------------------------


def _uvloop_cases() -> list[Callable[[ServeFactory], Awaitable[None]]]:
    """Every test above that takes only ``serve``, bar the known bugs."""
    module = sys.modules[__name__]
    return [
        fn
        for name, fn in vars(module).items()
        if name.startswith("test_")
        and "bug" not in name
        and "doubt" not in name
        and inspect.iscoroutinefunction(fn)
        and list(inspect.signature(fn).parameters) == ["serve"]
    ]


@pytest.mark.parametrize("case", _uvloop_cases(), ids=lambda fn: fn.__name__[5:])
def test_on_uvloop(case: Callable[[ServeFactory], Awaitable[None]]) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        async with serving() as serve:
            await case(serve)

    uvloop.run(main())
