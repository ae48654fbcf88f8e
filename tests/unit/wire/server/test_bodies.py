"""Request bodies: length and chunked, shares of work per loop turn, limits (413, 431, 400),
100-continue, refusals that still reach a client that is sending, slow bodies (408)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from llmobs.wire.http1 import MAX_TRAILER_BYTES, BadRequest
from llmobs.wire.server import (
    BodyTooLarge,
    BodyTooSlow,
    Request,
    error_body,
)
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
    read_to_eof,
)
from tests.support.servers import loop_turns

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
    assert error.status == 431  # what the relay answers (tests/e2e/test_hostile.py)
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


test_on_uvloop = on_uvloop(__name__)
