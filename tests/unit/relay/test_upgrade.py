"""Which requests are WebSocket upgrades (``relay/upgrade.py``), what of their handshake goes
upstream, and a switched connection: the 101 written as the engine sent it and the client's
transport handed over with what it sent after its request. Against real requests, parsed by
the client leg's server."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmobs.relay.headers import upstream_headers
from llmobs.relay.upgrade import is_websocket, upgrade_headers
from llmobs.wire.server import Request
from tests.support.protocol_server import serving
from tests.support.rawhttp import Client, read_response


async def _judged(head: str) -> dict[str, object]:
    async def handle(request: Request) -> None:
        headers = upstream_headers(request)
        if is_websocket(request):
            headers += upgrade_headers(request)
        verdict = {"websocket": is_websocket(request), "headers": headers}
        request.respond(200, json.dumps(verdict).encode())

    async with serving() as serve:
        served = await serve(handle)
        client: Client = await served.connect()
        await client.send(head.encode())
        response = await read_response(client.reader)
    answer: dict[str, object] = json.loads(response.body)
    return answer


@pytest.mark.parametrize(
    ("fields", "websocket"),
    [
        (["Upgrade: websocket", "Connection: Upgrade"], True),
        (["upgrade: WebSocket", "connection: keep-alive, upgrade"], True),
        (["Upgrade: websocket"], False),  # Connection does not name it: not an upgrade
        (["Upgrade: h2c", "Connection: Upgrade, HTTP2-Settings"], False),
        (["Connection: Upgrade"], False),
        (["Upgrade: websocket", "Connection: upgraded"], False),
    ],
)
async def test_what_is_an_upgrade_to_a_websocket(fields: list[str], websocket: bool) -> None:
    head = "\r\n".join(["GET /v1/realtime HTTP/1.1", "Host: x", *fields]) + "\r\n\r\n"
    assert (await _judged(head))["websocket"] is websocket


async def test_the_handshake_goes_upstream_intact() -> None:
    head = (
        "GET /v1/realtime?model=m HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: a2V5\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Extensions: permessage-deflate\r\nKeep-Alive: 5\r\n\r\n"
    )
    headers = [tuple(h) for h in (await _judged(head))["headers"]]  # type: ignore[attr-defined]
    assert ("Connection", "Upgrade") in headers and ("Upgrade", "websocket") in headers
    for name in ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions"):
        assert any(k == name for k, _ in headers)
    assert not any(k == "Keep-Alive" for k, _ in headers)  # other hop-by-hop ones still stop


async def test_a_switched_connection_is_the_handlers_with_what_followed() -> None:
    handed: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def handle(request: Request) -> None:
        transport, rest = request.switch(b"HTTP/1.1 101 Switching Protocols\r\nX: y\r\n\r\n")
        await asyncio.sleep(0.05)  # the client's first frame may follow the request at once
        handed.set_result(rest)
        transport.write(b"raw bytes, no HTTP")
        transport.close()

    async with serving() as serve:
        served = await serve(handle)
        client: Client = await served.connect()
        await client.send(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\nfirst frame")
        got = await asyncio.wait_for(client.reader.read(), 5)
        assert not served.server.connections  # no longer the server's once its handler ended
    assert got == b"HTTP/1.1 101 Switching Protocols\r\nX: y\r\n\r\nraw bytes, no HTTP"
    assert await handed == b"first frame"
