"""A TLS listener with its own accept loop, so that every handshake ends in a counted result.

Why not ``create_server(ssl=...)``: asyncio and uvloop both swallow a failed handshake (logged
only in debug mode), so a client certificate from another CA, a plain-HTTP client on the TLS
port or a handshake that never finishes would leave no trace. ``start_tls`` from a plain
protocol would tell, but uvloop hands the ClientHello to the plain protocol before it can be
switched. ``connect_accepted_socket`` does the handshake on a socket from our own accept and
raises its failure, on both loops; the protocol is made first and told of the connection only
once the handshake is done (its ``connection_made`` can read the ALPN protocol chosen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("llmobs.server")

# How a handshake ended: a closed set (the ``result`` label of llmobs_tls_handshakes_total)
OK = "ok"
TIMEOUT = "timeout"  # not finished within the client timeout (a silent or slow client)
CLOSED = "closed"  # the client went away mid-handshake (also: it did not trust our certificate)
NO_CERTIFICATE = "no_certificate"  # mTLS: the client showed none
BAD_CERTIFICATE = "bad_certificate"  # mTLS: the client's did not verify (another CA, expired)
PLAINTEXT = "plaintext"  # plain HTTP sent to the TLS port
PROTOCOL = "protocol"  # any other TLS failure: versions, ciphers, malformed records
ERROR = "error"  # anything else (a local error)
RESULTS = (OK, TIMEOUT, CLOSED, NO_CERTIFICATE, BAD_CERTIFICATE, PLAINTEXT, PROTOCOL, ERROR)

_BY_REASON = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": NO_CERTIFICATE,
    "CERTIFICATE_VERIFY_FAILED": BAD_CERTIFICATE,
    "HTTP_REQUEST": PLAINTEXT,
    "HTTPS_PROXY_REQUEST": PLAINTEXT,
}

OnHandshake = Callable[[str], None]
Protocols = Callable[[], asyncio.Protocol]


def handshake_result(exc: BaseException | None) -> str:
    """How a handshake ended, from what it raised (None: it succeeded)."""
    if exc is None:
        return OK
    if isinstance(exc, ssl.SSLError):
        return _BY_REASON.get(str(exc.reason), PROTOCOL)
    if isinstance(exc, ConnectionAbortedError | TimeoutError):
        return TIMEOUT  # (the loops' own handshake timeout raises ConnectionAbortedError)
    if isinstance(exc, ConnectionError | EOFError):
        return CLOSED
    return ERROR


def _sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for ``host`` (every address it resolves to, as asyncio binds them;
    an empty host: all interfaces), non-blocking; an ``OSError`` as binding raises it."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


class TlsListener:
    """Accepts on ``host``:``port`` and shakes hands with each connection in a task of its
    own, with the context ``context()`` gives at that moment (a rotated certificate applies to
    the next connection); ``on_handshake`` is told each result."""

    def __init__(
        self,
        context: Callable[[], ssl.SSLContext],
        protocols: Protocols,
        timeout: float,
        on_handshake: OnHandshake,
    ) -> None:
        self._context = context
        self._protocols = protocols
        self._timeout = timeout
        self._on_handshake = on_handshake
        self._sockets: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def listen(self, host: str, port: int, backlog: int = 1024) -> int:
        """Start accepting; returns the port bound (``port`` 0: a free one)."""
        loop = asyncio.get_running_loop()
        self._sockets = _sockets(host, port, backlog)
        for sock in self._sockets:
            self._spawn(loop, self._accept(loop, sock))
        return int(self._sockets[0].getsockname()[1])

    def _spawn(self, loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]) -> None:
        task = loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, loop: asyncio.AbstractEventLoop, listening: socket.socket) -> None:
        while True:
            try:
                sock, _ = await loop.sock_accept(listening)
            except OSError as exc:  # out of file descriptors, say: wait, do not spin
                log.warning("could not accept a TLS connection: %s", exc.strerror or exc)
                await asyncio.sleep(0.1)
                continue
            self._spawn(loop, self._handshake(loop, sock))

    async def _handshake(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        error: BaseException | None = None
        try:
            await loop.connect_accepted_socket(
                self._protocols,
                sock,
                ssl=self._context(),
                ssl_handshake_timeout=self._timeout,
            )
        except asyncio.CancelledError:
            sock.close()
            raise
        except Exception as exc:  # the handshake failed: the connection is closed already
            error = exc
            sock.close()
        try:
            self._on_handshake(handshake_result(error))
        except Exception:
            log.exception("could not count a TLS handshake")

    def close(self) -> None:
        """Stop accepting and give up the handshakes under way (connections made stay)."""
        for task in list(self._tasks):
            task.cancel()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self._sockets.clear()
