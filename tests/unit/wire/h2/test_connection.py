"""An HTTP/2 connection (``h2.connection``) on a real ``ProxyServer`` over loopback, with small
handlers instead of the relay: the preface's handoff from the HTTP/1.1 reader, a handler's
answer, its failure and its silence, connection-specific fields never sent, the idle close,
and a shutdown that lets the stream in flight end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import h2.errors
import h2.events
import pytest

from llmobs.wire.h2.stream import H2Stream
from llmobs.wire.request import BodyTooLarge
from llmobs.wire.server import ProxyServer
from tests.support.h2client import RawH2

Handler = Callable[[H2Stream], Awaitable[None]]


async def _answer(stream: H2Stream) -> None:
    try:
        body = await stream.read_body(5)
    except BodyTooLarge:
        stream.respond_error(413, "too large")
        return
    if stream.path == "/boom":
        raise RuntimeError("the handler's bug")
    if stream.path == "/silent":
        return
    if stream.path == "/slow":
        await asyncio.sleep(0.3)
    stream.begin(200, "OK", [("Connection", "keep-alive"), ("X-Echo", str(len(body)))], None)
    stream.write(b"got " + body)
    stream.end()


@pytest.fixture
async def served() -> AsyncIterator[tuple[ProxyServer, int]]:
    server = ProxyServer(_answer, client_timeout=0.5, max_body=1024)  # type: ignore[arg-type]
    port = await server.listen("127.0.0.1", 0)
    yield server, port
    await server.shutdown(1.0)


async def test_prior_knowledge_and_an_answer(served: tuple[ProxyServer, int]) -> None:
    client = await RawH2.connect(served[1])
    sid = client.request("/echo", b"hello")
    await client.flush()
    await client.until(lambda _: client.ended(sid))
    assert client.status(sid) == 200 and client.body(sid) == b"got hello"
    heads = [e.headers for e in client.events if isinstance(e, h2.events.ResponseReceived)]
    names = {str(name) for name, _ in heads[0]}
    assert "x-echo" in names and "connection" not in names  # HTTP/2 forbids it
    await client.close()


@pytest.mark.parametrize(
    ("path", "says"), [("/boom", b"internal error"), ("/silent", b"no response")]
)
async def test_a_handler_that_fails_or_says_nothing_is_a_500(
    served: tuple[ProxyServer, int], path: str, says: bytes
) -> None:
    client = await RawH2.connect(served[1])
    sid = client.request(path, b"{}")
    await client.flush()
    await client.until(lambda _: client.ended(sid))
    assert client.status(sid) == 500 and says in client.body(sid)
    await client.close()


async def test_an_idle_connection_is_closed_after_goaway(served: tuple[ProxyServer, int]) -> None:
    client = await RawH2.connect(served[1])
    await client.until(lambda _: False, within=5)
    assert client.goaway() == h2.errors.ErrorCodes.NO_ERROR and client.closed
    await client.close()


async def test_a_shutdown_lets_the_stream_in_flight_end(served: tuple[ProxyServer, int]) -> None:
    server, port = served
    client = await RawH2.connect(port)
    sid = client.request("/slow", b"x")
    await client.flush()
    await asyncio.sleep(0.05)
    stopping = asyncio.ensure_future(server.shutdown(5.0))
    await asyncio.sleep(0.05)
    late = client.request("/echo", b"y")  # after the shutdown began: refused, to retry
    await client.flush()
    await client.until(lambda _: client.goaway() is not None)
    assert client.status(sid) == 200 and client.body(sid) == b"got x"
    refused = [e for e in client.events if isinstance(e, h2.events.StreamReset)]
    assert [(e.stream_id, e.error_code) for e in refused] == [
        (late, h2.errors.ErrorCodes.REFUSED_STREAM)
    ]
    assert client.goaway() == h2.errors.ErrorCodes.NO_ERROR
    await stopping
    await client.close()


async def test_a_body_past_the_limit_is_answered_at_once(served: tuple[ProxyServer, int]) -> None:
    """1025 bytes of a 1024 limit, the stream left open: a 413 without waiting for its end,
    then the stream reset (NO_ERROR: the rest is not wanted), the connection kept."""
    client = await RawH2.connect(served[1])
    sid = client.request("/echo", b"x" * 1025, end=False)
    await client.flush()
    await client.until(lambda _: client.ended(sid))
    assert client.status(sid) == 413
    again = client.request("/echo", b"ok")
    await client.flush()
    await client.until(lambda _: client.ended(again))
    assert client.body(again) == b"got ok"
    await client.close()
