"""What the llama.cpp tests share: the engine (one per module), the client's process, and a
sidecar in front of the engine whose traces land in memory.

A module sets ``SLOTS`` for the engine's ``--parallel`` (1 when it does not): one slot serves
one request at a time, as a queue; more are decoded together (continuous batching).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.export.telemetry import build_telemetry
from tests.integration import client
from tests.integration.client import Call, Seen
from tests.integration.llamacpp import LlamaServer
from tests.support.servers import SidecarFactory, SidecarHandle, eventually


@pytest.fixture(scope="module")
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """One llama-server for the module: the model loads once (~1 s)."""
    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    with LlamaServer(log, slots=getattr(request.module, "SLOTS", 1)) as server:
        yield server


@pytest.fixture(scope="module")
def client_process() -> Iterator[ProcessPoolExecutor]:
    """The process the OpenAI SDK runs in (spawned: the test process has threads)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


@dataclass
class Traced:
    """A sidecar in front of the engine whose traces land in memory, and the client."""

    side: SidecarHandle
    exporter: InMemorySpanExporter
    pool: ProcessPoolExecutor
    engine_url: str

    def spans(self) -> list[ReadableSpan]:
        self.side.sidecar.flush_traces()
        return list(self.exporter.get_finished_spans())

    async def streams(self, calls: Sequence[Call], concurrently: bool = False) -> list[Seen]:
        """Stream ``calls`` through the sidecar with the SDK; wait until it has recorded them."""
        before = generations(self.side)
        loop = asyncio.get_running_loop()
        seen = await loop.run_in_executor(
            self.pool, client.streams, self.side.url, calls, concurrently, self.engine_url
        )
        await eventually(lambda: generations(self.side) == before + len(calls))
        return seen

    async def completion_tokens(self, call: Call) -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, client.completion_tokens, self.side.url, call)


@pytest.fixture
async def traced(
    request: pytest.FixtureRequest,
    engine: LlamaServer,
    start_sidecar: SidecarFactory,
    client_process: ProcessPoolExecutor,
) -> Traced:
    """The sidecar, with the module's ``SIDECAR`` settings (none by default)."""
    exporter = InMemorySpanExporter()
    overrides: dict[str, Any] = getattr(request.module, "SIDECAR", {})
    side = await start_sidecar(
        engine.url, telemetry=build_telemetry(span_exporter=exporter), **overrides
    )
    return Traced(side, exporter, client_process, engine.url)


def generations(side: SidecarHandle) -> float:
    """Chat and completion requests the sidecar finished (not the client's GET /v1/models)."""
    return side.value("llmobs_requests_total") - side.value(
        "llmobs_requests_total", gen_ai_operation_name="other"
    )
