"""The TLS listener: every handshake ends in one result from a closed set, told by real clients
over loopback (a trusted one, one without a certificate, one from another CA, plain HTTP, a
silent one, one that leaves, garbage); a rotated certificate serves the next connection."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trustme

from llmobs.wire import accept
from llmobs.wire.accept import TlsListener, handshake_result
from llmobs.wire.tls import ALPN_H2, ALPN_HTTP1, ServerFiles, Watched, server_tls
from tests.support.certs import Pem, ca_file, client_context, issue, replace
from tests.support.servers import eventually


def test_results_from_what_a_handshake_raised() -> None:
    def ssl_error(reason: str) -> ssl.SSLError:
        exc = ssl.SSLError(1, f"[SSL: {reason}] ...")
        exc.reason = reason
        return exc

    assert handshake_result(None) == accept.OK
    assert handshake_result(ssl_error("PEER_DID_NOT_RETURN_A_CERTIFICATE")) == "no_certificate"
    assert handshake_result(ssl_error("CERTIFICATE_VERIFY_FAILED")) == "bad_certificate"
    assert handshake_result(ssl_error("HTTP_REQUEST")) == "plaintext"
    assert handshake_result(ssl_error("UNSUPPORTED_PROTOCOL")) == "protocol"
    assert handshake_result(ConnectionAbortedError("taking longer")) == "timeout"
    assert handshake_result(TimeoutError()) == "timeout"
    assert handshake_result(ConnectionResetError()) == "closed"
    assert handshake_result(ValueError()) == "error"
    results = {handshake_result(e) for e in (None, ssl_error("x"), OSError(), EOFError())}
    assert results <= set(accept.RESULTS)


class _Echo(asyncio.Protocol):
    """Answers the first read with the ALPN protocol chosen and what it read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.alpn = transport.get_extra_info("ssl_object").selected_alpn_protocol() or "-"

    def data_received(self, data: bytes) -> None:
        self.transport.write(self.alpn.encode() + b" " + data)  # type: ignore[attr-defined]


class _Served:
    def __init__(self, pem: Pem, port: int, results: list[str]) -> None:
        self.pem, self.port, self.results = pem, port, results

    async def settled(self, count: int) -> list[str]:
        """The results once ``count`` handshakes have ended."""
        await eventually(lambda: len(self.results) >= count)
        return self.results

    async def ask(self, ctx: ssl.SSLContext) -> bytes:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=ctx, server_hostname="localhost"
        )
        writer.write(b"ping")
        try:
            return await reader.read(100)
        finally:
            writer.close()

    async def refused(self, ctx: ssl.SSLContext) -> bool:
        """Whether the listener refused this client: an alert, a reset, or (TLS 1.3, where the
        client finishes before the server has checked its certificate) nothing answered."""
        try:
            return await self.ask(ctx) == b""
        except (ssl.SSLError, ConnectionError):
            return True


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


async def _serve(
    context: Callable[[], ssl.SSLContext], pem: Pem, handshake_s: float = 5.0
) -> AsyncIterator[_Served]:
    results: list[str] = []
    listener = TlsListener(context, _Echo, handshake_s, results.append)
    port = await listener.listen("127.0.0.1", 0)
    try:
        yield _Served(pem, port, results)
    finally:
        listener.close()


@pytest.fixture
async def served(ca: trustme.CA, tmp_path: Path) -> AsyncIterator[_Served]:
    pem = issue(ca, tmp_path)
    clients = ca_file(ca, tmp_path / "clients.pem")  # mTLS: the same CA signs the clients
    tls = server_tls(ServerFiles(str(pem.cert), str(pem.key), str(clients)), (ALPN_H2, ALPN_HTTP1))
    async for s in _serve(lambda: tls.proxy, pem, handshake_s=0.5):
        yield s


async def test_a_trusted_client_is_answered_with_alpn(
    served: _Served, ca: trustme.CA, tmp_path: Path
) -> None:
    ctx = client_context(issue(ca, tmp_path, "client", "client"), ca)
    ctx.set_alpn_protocols([ALPN_H2])
    assert await served.ask(ctx) == b"h2 ping"
    assert await served.settled(1) == ["ok"]


async def test_clients_the_listener_refuses_are_told_apart(
    served: _Served, ca: trustme.CA, tmp_path: Path
) -> None:
    assert await served.refused(served.pem.trusting())
    stranger = trustme.CA()
    assert await served.refused(client_context(issue(stranger, tmp_path, "x", "x"), ca))
    assert await served.settled(2) == ["no_certificate", "bad_certificate"]


@pytest.mark.parametrize(
    ("send", "result"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "plaintext"),
        (b"\x16\x03\x01\x00\x05hello", "protocol"),
        (b"", "timeout"),  # a client that says nothing
        (b"\x16\x03\x01\x00\x50", "closed"),  # half a ClientHello, then gone
    ],
)
async def test_what_is_not_a_handshake(served: _Served, send: bytes, result: str) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(send)
    if result == "closed":
        writer.close()
    assert await served.settled(1) == [result]
    writer.close()


async def test_a_rotated_certificate_serves_the_next_connection(
    ca: trustme.CA, tmp_path: Path
) -> None:
    pem = issue(ca, tmp_path)
    files = ServerFiles(str(pem.cert), str(pem.key))
    watched = Watched(files.paths(), lambda: server_tls(files, (ALPN_HTTP1,)))
    async for served in _serve(lambda: watched.current.proxy, pem):
        assert await served.ask(pem.trusting((ALPN_HTTP1,))) == b"http/1.1 ping"
        successor = trustme.CA()
        replace(pem, issue(successor, tmp_path, "next"))
        assert watched.check() is True
        with pytest.raises(ssl.SSLCertVerificationError):  # the old CA no longer vouches
            await served.ask(pem.trusting((ALPN_HTTP1,)))
        probe = issue(successor, tmp_path, "probe").trusting((ALPN_HTTP1,))
        assert await served.ask(probe) == b"http/1.1 ping"
