"""Shared fixtures: real servers on loopback (the simulated engine, scripted upstreams, sidecars).

Nothing is mocked: every test talks HTTP over 127.0.0.1 to servers started here, each with its
own registry and meter provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmobs.app import Sidecar
from llmobs.collectors.nvml import NvmlBackend
from llmobs.config import Settings
from llmobs.metrics.sink import MetricsSink
from llmobs.sim import ENGINE_KEY, SimEngine, SimSettings, build_sim_app
from llmobs.telemetry import Telemetry, build_telemetry


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    """Start ``app`` on an ephemeral loopback port; return its runner and base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


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


SimFactory = Callable[..., Awaitable[SimHandle]]
SidecarFactory = Callable[..., Awaitable[SidecarHandle]]
AppFactory = Callable[[web.Application], Awaitable[str]]


@pytest.fixture
async def start_app() -> AsyncIterator[AppFactory]:
    """Serve any aiohttp app on loopback for the duration of a test."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner, url = await serve(app)
        runners.append(runner)
        gc.freeze()  # see start_sidecar: a scripted engine's schedule is timed too
        return url

    yield start
    for runner in reversed(runners):
        await runner.cleanup()
    if runners:
        gc.unfreeze()


@pytest.fixture
async def start_sim(start_app: AppFactory) -> SimFactory:
    """Start a simulated engine: ``await start_sim(max_batch=1, decode_base=0.02, ...)``."""

    async def start(**overrides: Any) -> SimHandle:
        settings = dataclasses.replace(SimSettings(), **overrides)
        app = build_sim_app(settings)
        url = await start_app(app)
        return SimHandle(url, app[ENGINE_KEY], settings)

    return start


@pytest.fixture
async def start_sidecar() -> AsyncIterator[SidecarFactory]:
    """Start a sidecar in front of ``upstream``: ``await start_sidecar(url, stall_factor=...)``;
    ``nvml=FakeNvml(...)`` gives it GPUs."""
    sidecars: list[Sidecar] = []

    async def start(
        upstream: str,
        telemetry: Telemetry | None = None,
        nvml: NvmlBackend | None = None,
        **overrides: Any,
    ) -> SidecarHandle:
        settings = Settings(
            upstream=upstream, host="127.0.0.1", port=0, metrics_host="127.0.0.1",
            metrics_port=0, **overrides,
        )  # fmt: skip
        telemetry = telemetry or build_telemetry()
        sidecar = Sidecar(settings, telemetry, nvml=nvml)
        await sidecar.start()
        sidecars.append(sidecar)
        # As ``llmobs serve`` does once started (``app.tune_process``): what lives now is
        # left out of collections. Here that is the test process's whole heap (pytest,
        # hypothesis, ...), whose full collection takes ~100 ms: in a request it would
        # show as a TTFT or a token gap the scripted upstream never made.
        gc.freeze()
        return SidecarHandle(
            f"http://127.0.0.1:{sidecar.port}",
            f"http://127.0.0.1:{sidecar.metrics_port}",
            telemetry.registry,
            sidecar,
        )

    yield start
    for sidecar in reversed(sidecars):
        await sidecar.stop()
    if sidecars:
        gc.unfreeze()


async def eventually(check: Callable[[], bool]) -> None:
    """Wait (up to 2 s) until ``check()`` holds: the handler's bookkeeping may finish just
    after the client has seen the end of its response."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.0
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
