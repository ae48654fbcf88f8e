"""A response as the handler writes it (``wire/request.py``, its second half): framed as the
request and the status allow (chunked, a length, until the close, none for HEAD), whole
chunks passed on as they came; the client's flow and departure told to the handler
(``on_flow``, ``on_gone``); and the answers the server writes itself, in the OpenAI shape."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest

from llmobs.wire.http1 import BadRequest
from llmobs.wire.request import openai_error_body, reason_phrase, refusal
from llmobs.wire.server import HIGH_WATER, LOW_WATER, Request
from tests.support.backpressure import Flow, flood, small_receiver
from tests.support.protocol_server import (
    Seen,
    ServeFactory,
    echo,
    on_uvloop,
    streaming,
)
from tests.support.rawhttp import (
    WAIT,
    closed,
    get,
    read_head,
    read_response,
    read_to_eof,
)

# -- framing --------------------------------------------------------------------------------


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


async def test_whole_chunks_go_as_they_came_and_the_last_ends_the_response(
    serve: ServeFactory,
) -> None:
    """Chunks framed already (the relay's engine bytes) go through ``write_chunks``, the
    last with ``write_last``: that ends the response, so ``end`` adds no second last chunk
    (the next response on the connection would start with it), and the connection carries
    the next request."""

    async def handle(request: Request) -> None:
        request.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
        assert request.write_chunks is not None
        request.write_chunks(b"5\r\nhello\r\n")
        request.write_last(b"5\r\nworld\r\n0\r\n\r\n")
        request.end()

    served = await serve(handle)
    client = await served.connect()
    await client.send(get("/a") + get("/b"))
    for _ in range(2):
        response = await read_response(client.reader)
        assert (response.status, response.body) == (200, b"helloworld")
        assert response.header("Connection") is None


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


async def test_the_end_is_written_once_and_empty_writes_write_nothing(serve: ServeFactory) -> None:
    """An empty ``write`` sends no chunk (an empty one would end the body), and a second
    ``end`` no second last chunk: either would be read as the start of the next response."""

    async def handle(request: Request) -> None:
        request.begin(200, "OK", [], None)
        request.write(b"")
        request.write(b"a")
        request.end()
        request.end()

    served = await serve(handle)
    client = await served.connect()
    await client.send(get("/a") + get("/b"))
    for _ in range(2):
        response = await read_response(client.reader)
        assert (response.status, response.body) == (200, b"a")
    client.writer.write_eof()
    assert await read_to_eof(client.reader) == b""  # nothing after the two responses


# -- the client's flow and departure --------------------------------------------------------


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


# -- the server's own answers ---------------------------------------------------------------


async def test_respond_200_has_the_reason_ok(serve: ServeFactory) -> None:
    """``respond`` writes the status's standard reason phrase (a 200 once went out as
    "200 Error", from a table of error statuses alone)."""
    seen = Seen()
    served = await serve(echo(seen))
    client = await served.connect()
    await client.send(get("/"))
    response = await read_response(client.reader)
    assert (response.status, response.reason) == (200, "OK")


@pytest.mark.parametrize(
    ("status", "phrase"),
    [(200, "OK"), (404, "Not Found"), (504, "Gateway Timeout"), (599, "Unknown"), (42, "Unknown")],
)
def test_the_reason_phrase_is_the_standard_one(status: int, phrase: str) -> None:
    assert reason_phrase(status) == phrase


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "bad_request"),
        (408, "request_timeout"),
        (431, "request_too_large"),
        (502, "upstream_error"),
        (504, "upstream_timeout"),
        (418, "error"),  # a status with no type of its own
    ],
)
def test_an_error_of_the_servers_own_is_in_the_openai_shape(status: int, kind: str) -> None:
    assert json.loads(openai_error_body(status, "llmobs: why")) == {
        "error": {"message": "llmobs: why", "type": kind, "code": status}
    }


@pytest.mark.parametrize("status", [400, 405, 431, 501, 505])
def test_a_refusal_is_a_whole_answer_that_closes(status: int) -> None:
    """What a request refused before it could be handled gets, in one write: a JSON error
    whose length the head gives, ``Connection: close``, and for a 405 the methods the relay
    forwards (RFC 9110 15.5.6)."""
    head, _, body = refusal(BadRequest(status, "why")).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == f"HTTP/1.1 {status} {reason_phrase(status)}"
    assert {"Connection: close", f"Content-Length: {len(body)}"} <= set(lines)
    assert body == openai_error_body(status, "llmobs: why")
    allowed = [line for line in lines if line.startswith("Allow:")]
    methods = "Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
    assert allowed == ([methods] if status == 405 else [])


async def test_an_error_goes_in_the_shape_it_is_given(serve: ServeFactory) -> None:
    """``respond_error`` sends the body it is given (the relay's, in the request's API's own
    shape), else one in the OpenAI shape; ``close`` ends the connection after it."""

    async def handle(request: Request) -> None:
        if request.target == "/own":
            request.respond_error(400, "unused", body=b'{"type":"error"}')
        else:
            request.respond_error(504, "llmobs: upstream timed out", close=True)

    served = await serve(handle)
    client = await served.connect()
    await client.send(get("/own") + get("/openai") + get("/never"))
    own = await read_response(client.reader)
    assert (own.status, own.body, own.header("Connection")) == (400, b'{"type":"error"}', None)
    shaped = await read_response(client.reader)
    assert (shaped.status, shaped.reason, shaped.header("Connection")) == (
        504, "Gateway Timeout", "close",
    )  # fmt: skip
    assert shaped.header("Content-Type") == "application/json"
    assert json.loads(shaped.body)["error"]["type"] == "upstream_timeout"
    assert await closed(client.reader)


test_on_uvloop = on_uvloop(__name__)
