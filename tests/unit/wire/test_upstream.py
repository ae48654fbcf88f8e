"""The engine's address and the pool of connections to it (``wire/upstream.py``): the request
head it writes (``Host`` and the framing, nothing else added); idle connections reused, most
recent first, unless the engine closed them, spent them or left them idle too long; a batch's
connections kept for the next batch; an engine that closes after each stream, learnt at once
(``habits``). One connection's exchange: tests/unit/wire/test_connection.py."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from llmobs.wire.http1 import ResponseHead
from llmobs.wire.upstream import Exchange, OnBody, Upstream
from tests.support.ports import port_of, refused_port
from tests.support.rawhttp import WAIT
from tests.support.servers import SidecarFactory
from tests.support.upstreams import keep_alive, post, raw_upstream

QUIET = {"engine_scrape_interval": 0, "gpu_sample_interval": 0}


@pytest.mark.parametrize(
    ("url", "host", "target"),
    [
        ("http://engine:8000", "engine:8000", "/v1/models?x=1"),
        ("http://engine", "engine", "/v1/models?x=1"),  # the scheme's port: not named
        ("https://engine", "engine", "/v1/models?x=1"),
        ("https://engine:443", "engine:443", "/v1/models?x=1"),  # as the URL names it
        ("http://[::1]:8000/base/", "[::1]:8000", "/base/v1/models?x=1"),
        ("http://10.0.0.7/base", "10.0.0.7", "/base/v1/models?x=1"),
    ],
)
def test_the_request_head_names_the_engine_and_its_base_path(
    url: str, host: str, target: str
) -> None:
    upstream = Upstream(url, 1.0, 4.0)
    head = upstream.request_head("POST", "/v1/models?x=1", [("X-A", "1"), ("x-a", "2")], b"{}")
    assert (
        head
        == (
            f"POST {target} HTTP/1.1\r\nHost: {host}\r\nX-A: 1\r\nx-a: 2\r\n"
            "Content-Length: 2\r\n\r\n"
        ).encode()
    )


def test_the_framing_is_the_bodys_own() -> None:
    """A length for any body, an empty one too (a POST without one); none without a body."""
    upstream = Upstream("http://engine", 1.0, 4.0)
    assert upstream.request_head("GET", "/", [], None) == b"GET / HTTP/1.1\r\nHost: engine\r\n\r\n"
    empty = upstream.request_head("POST", "/", [], b"")
    assert empty == b"POST / HTTP/1.1\r\nHost: engine\r\nContent-Length: 0\r\n\r\n"


def ignore(conn: Exchange, head: ResponseHead) -> OnBody:
    return lambda payload, frame, last: None


async def test_a_released_connection_is_reused_and_a_discarded_one_is_not() -> None:
    """The first connection back from a streamed response is reused once it has stayed open
    ``SETTLE`` seconds, which settles the engine's habit (it keeps them); a discarded one
    is closed, and the next request opens another; ``close`` closes the busy ones too."""
    async with raw_upstream(keep_alive) as (engine, url):
        upstream = Upstream(url, 1.0, 4.0)
        try:
            first, reused = await upstream.acquire()
            first.send("GET", upstream.request_head("GET", "/", [], None), b"", ignore)
            await asyncio.wait_for(first.wait(WAIT), WAIT)
            upstream.release(first)
            again, reused = await upstream.acquire()
            assert (again, reused, upstream.habits.closes_after_stream) == (first, True, False)
            upstream.discard(again)
            other, reused = await upstream.acquire()
            assert (other is first, reused, first.closed) == (False, False, True)
            upstream.close()
            assert other.transport is not None and other.transport.is_closing()
        finally:
            upstream.close()
        assert engine.connections == 2


async def test_an_engine_that_refuses_connections_fails_the_acquire() -> None:
    with refused_port() as refused:
        upstream = Upstream(f"http://127.0.0.1:{port_of(refused)}", WAIT, 4.0)
        with pytest.raises(ConnectionRefusedError):
            await upstream.acquire()


async def test_sequential_requests_share_one_pooled_connection(
    start_sidecar: SidecarFactory,
) -> None:
    async with raw_upstream(keep_alive) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                status, body = await post(session, side.url)
                assert status == 200
                assert body.count(b"data: ") == 4
        assert upstream.requests == 5
        assert upstream.connections == 1
        assert side.value("llmobs_requests_total", outcome="ok") == 5
        head = upstream.heads[0].decode("latin-1")
        assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{url.rsplit(':', 1)[1]}\r\n" in head
        assert "Content-Length: " in head
        assert "transfer-encoding" not in head.lower()


async def test_an_engine_that_closes_after_each_stream_fails_no_request(
    start_sidecar: SidecarFactory,
) -> None:
    """llama-server's habit: ``Keep-Alive`` offered, then the connection closed a moment after
    each streamed response. A request that took it in that moment would never be read, and
    a POST cannot go again: the pool learns the habit at once, so none is lost."""

    async def close_soon_after(writer: asyncio.StreamWriter, _: int) -> bool:
        await keep_alive(writer, 0)
        await asyncio.sleep(0.02)  # what comes meanwhile is never read
        return False

    async with raw_upstream(close_soon_after) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            results = [await post(session, side.url) for _ in range(20)]
        assert [s for s, _ in results] == [200] * 20
        assert upstream.requests == upstream.connections == 20  # one each
        assert side.value("llmobs_requests_total", outcome="ok") == 20


async def test_a_connection_the_engine_closed_after_a_response_is_not_reused_blindly(
    start_sidecar: SidecarFactory,
) -> None:
    """The engine closes every connection after answering, without saying so (an idle
    timeout racing the next request): no request may fail for it."""

    async def close_after(writer: asyncio.StreamWriter, _: int) -> bool:
        await keep_alive(writer, 0)
        return False

    async with raw_upstream(close_after) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            results = [await post(session, side.url) for _ in range(10)]
        assert [s for s, _ in results] == [200] * 10
        assert all(body.endswith(b"data: [DONE]\n\n") for _, body in results)
        assert upstream.requests == 10
        assert side.value("llmobs_requests_total", outcome="ok") == 10


async def test_a_connection_idle_past_the_idle_timeout_is_not_reused(
    start_sidecar: SidecarFactory,
) -> None:
    """An engine closes a connection idle for its keep-alive timeout, and a request sent on
    it just then fails: the pool gives connections up before (``--upstream-idle-timeout``)."""
    async with raw_upstream(keep_alive) as (upstream, url):
        side = await start_sidecar(url, upstream_idle_timeout=0.3, **QUIET)
        async with aiohttp.ClientSession() as session:
            for pause in (0.0, 0.0, 0.6, 0.0):
                await asyncio.sleep(pause)
                assert (await post(session, side.url))[0] == 200
        assert upstream.requests == 4
        assert upstream.connections == 2  # a new one after the pause only


async def test_a_batch_that_ends_together_keeps_its_connections(
    start_sidecar: SidecarFactory,
) -> None:
    """300 streams at once (more than the old pool of 256), twice: the second wave reuses
    the first wave's 300 connections; none is closed only to be opened again at once."""
    wave = 300
    arrived = asyncio.Event()

    async def together(writer: asyncio.StreamWriter, n: int) -> bool:
        if n % wave == 0:
            arrived.set()  # the whole wave is in: answer them all
        await asyncio.wait_for(arrived.wait(), 20)
        return await keep_alive(writer, n)

    async with raw_upstream(together) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(2):
                arrived.clear()
                results = await asyncio.gather(*(post(session, side.url) for _ in range(wave)))
                assert [s for s, _ in results] == [200] * wave
        assert upstream.requests == 2 * wave
        assert upstream.connections == wave
