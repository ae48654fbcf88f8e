"""The exchange (``relay/proxy.py``) through a sidecar, against engines scripted byte by byte:
a request is sent again only when that is safe (idempotent, on a pooled connection the engine
closed unanswered), a client cut off for not reading ends its engine's connection too, a
finished request leaves no reference cycle, and the relay runs on uvloop as the CLI starts it.
Its steps end to end: tests/e2e/test_proxy.py and test_faults.py."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import sys
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from tests.support import ROOT
from tests.support.backpressure import Flood, read_events, slow_client
from tests.support.leaks import cyclic_garbage
from tests.support.servers import SidecarFactory, SimFactory, eventually
from tests.support.upstreams import keep_alive, post, raw_upstream

QUIET = {"engine_scrape_interval": 0, "gpu_sample_interval": 0}


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with session.get(url + "/v1/models") as r:
        return r.status, await r.read()


@pytest.mark.parametrize(
    ("send", "reply", "statuses", "requests"),
    [
        # closed without a byte (its idle timeout fired as the request came): an idempotent
        # request is sent again on a new connection
        (get, b"", [200, 200], 3),
        # a POST is not: the engine read it, and may have failed on it (RFC 9110 9.2.2)
        (post, b"", [200, 502], 2),
        # a byte of a response means the engine took it: a cut there is a 502, never the
        # request sent a second time
        (get, b"HTTP/1.1 200 OK\r\nContent-Ty", [200, 502], 2),
    ],
    ids=["get-closed-silent-is-retried", "post-is-not", "cut-mid-head-is-not"],
)
async def test_a_pooled_connection_closed_as_a_request_arrives(
    start_sidecar: SidecarFactory,
    send: Callable[[aiohttp.ClientSession, str], Awaitable[tuple[int, bytes]]],
    reply: bytes,
    statuses: list[int],
    requests: int,
) -> None:
    """The race itself: the engine takes the second request on the pooled connection and
    closes it, with ``reply`` written first. Retried once exactly when nothing came and the
    request may be repeated."""

    async def close_second(writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            writer.write(reply)
            await writer.drain()
            return False
        return await keep_alive(writer, n)

    async with raw_upstream(close_second) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            results = [await send(session, side.url) for _ in range(2)]
        assert [s for s, _ in results] == statuses
        assert results[0][1].endswith(b"data: [DONE]\n\n")
        assert upstream.requests == requests
        assert upstream.connections == requests - 1  # a retry, on a connection of its own
        ok = statuses.count(200)
        await eventually(lambda: side.value("llmobs_requests_total", outcome="ok") == ok)
        assert side.value("llmobs_requests_total", outcome="upstream_error") == 2 - ok


async def test_a_new_connection_closed_without_a_response_is_a_502_not_a_retry(
    start_sidecar: SidecarFactory,
) -> None:
    """On a fresh connection the engine did see the request: sending it again could run it
    twice, so it is an upstream error."""

    async def drop(writer: asyncio.StreamWriter, n: int) -> bool:
        return False

    async with raw_upstream(drop) as (upstream, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            status, body = await post(session, side.url)
        assert status == 502
        assert b"upstream unavailable" in body
        assert upstream.requests == 1
        await eventually(lambda: side.value("llmobs_requests_total", outcome="upstream_error") == 1)


async def test_a_client_that_stops_reading_is_cut_off_after_the_client_timeout(
    start_sidecar: SidecarFactory,
) -> None:
    """A stalled reader cannot hold a stream, and the engine's slot, for ever: once it has
    taken nothing of its response for ``--client-timeout``, its connection is closed, the
    engine's with it, and the request ends as ``client_disconnect``."""
    flood = Flood(total=512)
    async with raw_upstream(flood) as (_, url):
        side = await start_sidecar(url, client_timeout=1.5, read_timeout=60, **QUIET)
        reader, writer = await slow_client(side.url)
        await asyncio.sleep(0.75)  # paused, and not for long enough
        assert not flood.cut.is_set()
        assert side.value("llmobs_requests_total", outcome="client_disconnect") == 0
        await asyncio.wait_for(flood.cut.wait(), 15)
        assert flood.sent < flood.total / 2
        await eventually(
            lambda: side.value("llmobs_requests_total", outcome="client_disconnect") == 1
        )
        with contextlib.suppress(ConnectionError):
            assert await read_events(reader, flood.total) < flood.total  # cut short
        writer.close()


async def test_a_relayed_request_leaves_no_reference_cycles(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """Every object of a finished request is freed by reference counting: cyclic garbage
    (a closure holding its own timer, say) waits for the collector, whose passes over
    everything young stall the loop for milliseconds under load (docs/benchmarks.md)."""
    sim = await start_sim(prefill_base=0.0, decode_base=0.0005, decode_per_seq=0.0)
    side = await start_sidecar(sim.url, **QUIET)
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm: pools, label sets, templates
            await post(session, side.url)
        with cyclic_garbage() as cyclic:
            for _ in range(20):
                status, _ = await post(session, side.url)
                assert status == 200
            await eventually(lambda: side.value("llmobs_requests_total") == 23)
    assert cyclic == []


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop not installed")
async def test_the_cli_serves_on_uvloop(start_sim: SimFactory) -> None:
    sim = await start_sim()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mport = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", "serve", "--upstream", sim.url, "--host", "127.0.0.1",
        "--port", str(port), "--metrics-host", "127.0.0.1", "--metrics-port", str(mport),
        "--event-loop", "uvloop", "--log-level", "debug", "--engine-scrape-interval", "0",
        "--gpu-sample-interval", "0", cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{mport}/healthz") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.1)
            statuses = await asyncio.gather(
                *(post(session, f"http://127.0.0.1:{port}") for _ in range(8))
            )
            assert all(s == 200 and b.endswith(b"data: [DONE]\n\n") for s, b in statuses)
            async with session.get(f"http://127.0.0.1:{mport}/metrics") as r:
                text = await r.text()
        ok = [
            line for line in text.splitlines()
            if line.startswith("llmobs_requests_total{") and 'outcome="ok"' in line
        ]  # fmt: skip
        assert sum(float(line.rsplit(" ", 1)[1]) for line in ok) == 8
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert b"event loop: uvloop" in err
