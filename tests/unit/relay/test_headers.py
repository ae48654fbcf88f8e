"""Which headers cross the relay (``relay/headers.py``): hop-by-hop ones and those
``Connection`` names stop, in either direction; upstream, ``Host``, ``Expect`` and the framing
are left to the engine leg, ``X-Forwarded-For`` is extended with the client's address and
``X-Forwarded-Proto`` added unless the client's own passes. Against a real request, parsed
by the client leg's server. (The trace context: tests/e2e/test_proxy.py.)"""

from __future__ import annotations

import json

import pytest

from llmobs.relay.headers import HOP_BY_HOP, filter_headers, upstream_headers
from llmobs.wire.server import Request
from tests.support.protocol_server import serving
from tests.support.rawhttp import Client, read_response


def test_hop_by_hop_headers_and_those_connection_names_are_dropped() -> None:
    fields = [
        ("Content-Type", "text/event-stream"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("X-Secret-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("X-Request-Id", "abc"),
        ("connection", "close, x-other"),
        ("X-Other", "2"),
    ]
    assert filter_headers(fields) == [
        ("Content-Type", "text/event-stream"),
        ("X-Request-Id", "abc"),
    ]
    # what the relay also drops is given by the caller; the order of the rest is kept
    assert filter_headers([("Host", "a"), ("B", "1"), ("A", "2")], HOP_BY_HOP | {"host"}) == [
        ("B", "1"),
        ("A", "2"),
    ]


async def forwarded(*fields: str) -> list[list[str]]:
    """The headers ``upstream_headers`` makes of a GET with ``fields``, from 127.0.0.1."""

    async def handle(request: Request) -> None:
        request.respond(200, json.dumps(upstream_headers(request)).encode())

    async with serving() as serve:
        served = await serve(handle)
        client: Client = await served.connect()
        await client.send(("\r\n".join(["GET /v1/models HTTP/1.1", *fields]) + "\r\n\r\n").encode())
        response = await read_response(client.reader)
    assert response.status == 200
    made: list[list[str]] = json.loads(response.body)
    return made


@pytest.mark.parametrize(
    ("fields", "made"),
    [
        (  # what the engine leg writes anew, what the sidecar answered, and hop-by-hop ones
            ["Host: sidecar", "Expect: 100-continue", "Content-Length: 0", "Keep-Alive: 5",
             "Connection: keep-alive, X-Hop", "X-Hop: 1", "Authorization: Bearer k"],
            [["Authorization", "Bearer k"], ["X-Forwarded-For", "127.0.0.1"],
             ["X-Forwarded-Proto", "http"]],
        ),
        (  # a chain from proxies before: extended, its blank entries dropped
            ["X-Forwarded-For: 203.0.113.7", "x-forwarded-for:  ", "X-Forwarded-For: 10.0.0.1"],
            [["X-Forwarded-For", "203.0.113.7, 10.0.0.1, 127.0.0.1"],
             ["X-Forwarded-Proto", "http"]],
        ),
        (  # the client's (a TLS proxy before us) passes as it came
            ["X-Forwarded-Proto: https"],
            [["X-Forwarded-Proto", "https"], ["X-Forwarded-For", "127.0.0.1"]],
        ),
        (  # ... unless it is hop-by-hop: then ours
            ["Connection: X-Forwarded-Proto", "X-Forwarded-Proto: https"],
            [["X-Forwarded-For", "127.0.0.1"], ["X-Forwarded-Proto", "http"]],
        ),
    ],
    ids=["dropped", "chain", "proto-passed", "proto-hop"],
)  # fmt: skip
async def test_what_goes_upstream(fields: list[str], made: list[list[str]]) -> None:
    assert await forwarded(*fields) == made
