"""Shared fixtures: real servers on loopback (the simulated engine, scripted upstreams, sidecars).

Nothing is mocked: every test talks HTTP over 127.0.0.1 to servers started here, each with its
own registry and meter provider. What they start and return: ``tests/support/servers.py``.
"""

from __future__ import annotations

import dataclasses
import gc
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import settings

from llmobs.app import Sidecar
from llmobs.collectors.nvml import NvmlBackend
from llmobs.config.settings import Settings
from llmobs.export.telemetry import Telemetry, build_telemetry
from llmobs.sim import ENGINE_KEY, SimSettings, build_sim_app
from tests.support.servers import (
    AppFactory,
    SidecarFactory,
    SidecarHandle,
    SimFactory,
    SimHandle,
    serve,
)

# No deadline for any property test: on a loaded machine one example can take longer than
# hypothesis' default, and a slow example is not a failing one (the suite's timeout catches a
# hang). Tests that set their own settings keep them.
settings.register_profile("llmobs", deadline=None)
settings.load_profile("llmobs")


@pytest.fixture
async def start_app() -> AsyncIterator[AppFactory]:
    """Serve any aiohttp app on loopback for the duration of a test."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application, tls: ssl.SSLContext | None = None) -> str:
        runner, url = await serve(app, tls)
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
    """Start a simulated engine: ``await start_sim(max_batch=1, decode_base=0.02, ...)``;
    ``tls=`` a server context: over HTTPS."""

    async def start(tls: ssl.SSLContext | None = None, **overrides: Any) -> SimHandle:
        settings = dataclasses.replace(SimSettings(), **overrides)
        app = build_sim_app(settings)
        url = await start_app(app, tls)
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
        # No engine collector unless a test asks for one: its first scrape, at start, would
        # be a GET /metrics that engines counting their requests (scripted ones) would see.
        overrides.setdefault("engine_scrape_interval", 0)
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
        scheme, metrics_scheme = (
            "https" if on else "http" for on in (settings.tls_cert_file, settings.metrics_tls)
        )
        return SidecarHandle(
            f"{scheme}://127.0.0.1:{sidecar.port}",
            f"{metrics_scheme}://127.0.0.1:{sidecar.metrics_port}",
            telemetry.registry,
            sidecar,
        )

    yield start
    for sidecar in reversed(sidecars):
        await sidecar.stop()
    if sidecars:
        gc.unfreeze()
