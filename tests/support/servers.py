"""Servers on loopback as the tests start them: the simulated engine, sidecars, any aiohttp app;
their handles; and the waits the tests use on them."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmobs.app import Sidecar
from llmobs.export.metrics.sink import MetricsSink
from llmobs.sim import SimEngine, SimSettings

Json = dict[str, Any]


async def serve(
    app: web.Application, tls: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, str]:
    """Start ``app`` on an ephemeral loopback port (HTTPS with ``tls``); return its runner and
    base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
    host, port = runner.addresses[0][:2]
    return runner, f"{'https' if tls else 'http'}://{host}:{port}"


@dataclass
class SimHandle:
    url: str
    engine: SimEngine
    settings: SimSettings


@dataclass
class SidecarHandle:
    url: str
    metrics_url: str
    registry: CollectorRegistry
    sidecar: Sidecar

    @property
    def sink(self) -> MetricsSink:
        return self.sidecar.proxy.sink

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    async def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """GET /metrics from the admin port and parse it."""
        async with aiohttp.ClientSession() as s, s.get(self.metrics_url + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out

    async def live(self, holds: Callable[[Json], bool], within: float = 30.0) -> Json:
        """The live page's data (``/ui/data``) once ``holds(data)``: its ticker adds a point
        a second, so a test waits for the point it needs, not for a second to pass (which
        a loaded machine stretches, and which may hold a tick more than the test expects)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        async with aiohttp.ClientSession() as s:
            while True:
                async with s.get(self.metrics_url + "/ui/data") as r:
                    assert r.status == 200
                    data: Json = await r.json()
                if holds(data):
                    return data
                assert loop.time() < deadline, f"the live page never showed it: {data}"
                await asyncio.sleep(0.1)


def requests_shown(data: Json) -> float:
    """The requests the live page's points count, every model together."""
    return float(sum(v or 0 for v in data["models"]["all"]["requests"]))


SimFactory = Callable[..., Awaitable[SimHandle]]
SidecarFactory = Callable[..., Awaitable[SidecarHandle]]
AppFactory = Callable[..., Awaitable[str]]  # (app, tls=None)


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until ``check()`` holds: the handler's bookkeeping may finish just after the
    client has seen the end of its response, an export or a poll a little later. The bound
    only ends a failing test: generous, for a loaded machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


@dataclass
class LoopTurns:
    count: int = 0


@contextlib.asynccontextmanager
async def loop_turns() -> AsyncIterator[LoopTurns]:
    """Count the event loop's turns while the body runs: a task that yields once a turn. What
    one connection's work is spread over shows as many turns; done in one callback, as one."""
    turns = LoopTurns()
    done = asyncio.Event()

    async def count() -> None:
        while not done.is_set():
            turns.count += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count())
    try:
        yield turns
    finally:
        done.set()
        await counter
