"""Requests on a connection: what the handler sees, keep-alive, pipelining, and malformed
requests (a JSON error, then a close)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest

from llmobs.wire.http1 import MAX_REQUEST_HEAD_BYTES
from tests.support.protocol_server import (
    Seen,
    ServeFactory,
    blocked,
    echo,
    on_uvloop,
)
from tests.support.rawhttp import (
    WAIT,
    closed,
    get,
    post,
    read_response,
    read_to_eof,
)
from tests.support.servers import eventually

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


async def test_the_declared_length_of_each_framing(serve: ServeFactory) -> None:
    """``content_length`` is what the head declares: a length (0 too), None for chunked or
    nothing declared."""
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
    await read_response(client.reader)
    await client.send(
        b"POST /b HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    )
    await read_response(client.reader)
    await client.send(get("/c"))
    assert (await read_response(client.reader)).status == 200
    assert [(r.path, r.has_body, r.content_length) for r in seen.requests] == [
        ("/a", False, 0), ("/b", True, None), ("/c", False, None),
    ]  # fmt: skip


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


test_on_uvloop = on_uvloop(__name__)
