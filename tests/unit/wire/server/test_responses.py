"""Responses: chunked on HTTP/1.1, unframed on HTTP/1.0, HEAD; and handlers that fail or leave
a response unfinished."""

from __future__ import annotations

import json

import aiohttp
import pytest

from llmobs.wire.server import (
    Request,
)
from tests.support.protocol_server import (
    Seen,
    ServeFactory,
    echo,
    on_uvloop,
    streaming,
)
from tests.support.rawhttp import (
    closed,
    get,
    read_head,
    read_response,
    read_to_eof,
)

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


test_on_uvloop = on_uvloop(__name__)
