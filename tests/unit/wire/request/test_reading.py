"""A request as the handler reads it (``wire/request.py``, its first half): what the head
says of it; its body read whole, bounded in size (its framing counted) and in time, a broken
framing refused; ``100 Continue`` sent only when the handler asks for the body."""

from __future__ import annotations

import asyncio

from llmobs.wire.http1 import MAX_TRAILER_BYTES, BadRequest
from llmobs.wire.request import openai_error_body
from llmobs.wire.server import BodyTooLarge, BodyTooSlow, Request
from tests.support.protocol_server import (
    Seen,
    ServeFactory,
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

CHUNKED_HEAD = b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"

# -- the head -------------------------------------------------------------------------------


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


# -- the body -------------------------------------------------------------------------------


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


async def test_the_body_limit_counts_the_framing(serve: ServeFactory) -> None:
    """``--max-body-bytes`` bounds the body as it comes over the wire: 600 bytes of payload in
    1-byte chunks are 3,600 bytes to read (the probe sent 100 MB for 16 MiB of payload)."""
    seen = Seen()
    served = await serve(echo(seen), max_body=1000)
    client = await served.connect()
    await client.send(CHUNKED_HEAD + chunked(*[b"x"] * 600))
    assert (await read_response(client.reader)).status == 413
    assert [type(e) for e in seen.errors] == [BodyTooLarge]
    client = await served.connect()  # the framing of a body that fits counts, and fits
    await client.send(CHUNKED_HEAD + chunked(b"y" * 900))
    assert (await read_response(client.reader)).body == b"POST /up\n" + b"y" * 900


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


async def test_what_follows_a_body_at_the_limit_does_not_count_against_it(
    serve: ServeFactory,
) -> None:
    """The limit is the body's: a request pipelined behind a body of exactly ``max_body``
    bytes, in the same read, is the next request, not bytes over the limit."""
    seen = Seen()
    served = await serve(echo(seen), max_body=100)
    client = await served.connect()
    await client.send(post("/fits", b"x" * 100) + get("/next"))
    assert (await read_response(client.reader)).body == b"POST /fits\n" + b"x" * 100
    assert (await read_response(client.reader)).body == b"GET /next\n"
    assert seen.errors == []


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
    assert error.status == 431  # what the relay answers (tests/e2e/test_hostile.py)
    assert "trailer" in str(error)


async def test_a_chunk_extension_over_the_line_limit_is_400(serve: ServeFactory) -> None:
    seen = Seen()
    served = await serve(echo(seen), max_body=1 << 20)
    client = await served.connect()
    await client.send(CHUNKED_HEAD + b"1;a=" + b"b" * 100_000 + b"\r\nx\r\n0\r\n\r\n")
    assert (await read_response(client.reader)).status == 400
    assert [type(e) for e in seen.errors] == [BadRequest]


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


# -- 100 Continue ---------------------------------------------------------------------------


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
        request.respond(413, openai_error_body(413, "too large"), close=True)

    served = await serve(refuse)
    client = await served.connect()
    await client.send(post("/e", b"", "Expect: 100-continue").replace(b"th: 0", b"th: 99"))
    response = await read_response(client.reader)
    assert response.status == 413
    assert response.header("Connection") == "close"
    assert await closed(client.reader)


async def test_a_response_sent_before_the_body_says_connection_close(
    serve: ServeFactory,
) -> None:
    """The handler answers on the head alone, without ``close=True``: the server closes the
    connection (the body was never read) but its response does not say so (RFC 9110 10.1.1:
    SHOULD say whether it closes or reads on), so the client may still send the body."""

    async def refuse(request: Request) -> None:
        request.respond(413, openai_error_body(413, "too large"))

    served = await serve(refuse)
    client = await served.connect()
    await client.send(post("/e", b"", "Expect: 100-continue").replace(b"th: 0", b"th: 99"))
    response = await read_response(client.reader)
    assert response.status == 413
    assert await closed(client.reader)
    assert response.header("Connection") == "close"


test_on_uvloop = on_uvloop(__name__)
