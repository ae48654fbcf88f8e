"""The sim's HTTP/2 (``llmobs sim --http2``): h2c with prior knowledge, and h2 by ALPN over
TLS, as an engine that serves HTTP/2 does, for the sidecar's ``--upstream-http2``.

aiohttp serves HTTP/1.1 only, so the sim's application listens on a loopback port of its own
and this front, the sidecar's own client leg (``wire.server.ProxyServer``, which speaks
HTTP/1.1 and HTTP/2 on one port), passes each request to it and its response back as it
comes, a read at a time. The schedule is still the engine's: the front adds a loopback hop
(tens of microseconds per chunk), no buffering. A client gone closes the inner request, so
the engine frees its place as it does without the front.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

from llmobs.wire.connection import Exchange, UpstreamClosed, UpstreamTimeout
from llmobs.wire.http1 import ResponseHead, content_length
from llmobs.wire.server import ProxyServer, Request
from llmobs.wire.upstream import Upstream

_NOT_PASSED = frozenset({
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "expect",
    "upgrade", "te", "proxy-connection",
})  # fmt: skip
READ_TIMEOUT = 600.0  # seconds the inner server may be silent (the sim is never, but a fault)


class Front:
    """Each request on the public port, passed to the sim's application at ``inner``."""

    def __init__(self, inner: str) -> None:
        self.upstream = Upstream(inner, connect_timeout=5.0, idle_timeout=4.0)

    async def __call__(self, request: Any) -> None:
        body: bytes | None = None
        if request.has_body:
            body = await request.read_body(READ_TIMEOUT)
        fields = [(k, v) for k, v in request.head.fields if k.lower() not in _NOT_PASSED]
        raw = self.upstream.request_head(request.method, request.target, fields, body)
        try:
            conn, _ = await self.upstream.acquire()
        except (OSError, UpstreamTimeout):
            request.respond_error(502, "sim front: the application is not reachable")
            return
        try:
            conn.send(request.method, raw, body or b"", _relayed(request))
            request.on_gone(conn.close)
            await conn.wait(READ_TIMEOUT)
        except (UpstreamClosed, UpstreamTimeout, ConnectionError):
            self.upstream.discard(conn)
            if request.started:
                request.abort()
            elif not request.closed:
                request.respond_error(502, "sim front: the application did not answer")
            return
        finally:
            request.on_gone(None)
        request.end()
        self.upstream.release(conn)


def _relayed(request: Request) -> Callable[[Exchange, ResponseHead], Callable[..., None]]:
    """The inner response's head to the client, then each read of its body as it came."""

    def on_head(conn: Exchange, head: ResponseHead) -> Callable[..., None]:
        fields = [(k, v) for k, v in head.fields if k.lower() not in _NOT_PASSED]
        length = None if "Transfer-Encoding" in head.headers else content_length(head.headers)
        request.begin(head.status, head.reason, fields, length)

        def body(data: bytes, frame: bytes | None, last: bool) -> None:
            request.write(data)

        return body

    return on_head


async def serve_front(
    inner: str, host: str, port: int, tls: Callable[[], ssl.SSLContext] | None
) -> tuple[ProxyServer, int]:
    """The front listening on ``host``:``port`` (h2c and HTTP/1.1; with ``tls``, h2 by ALPN),
    and the port it bound."""
    server = ProxyServer(Front(inner), client_timeout=60.0, max_body=64 * 1024**2, http2=True)
    return server, await server.listen(host, port, tls)
