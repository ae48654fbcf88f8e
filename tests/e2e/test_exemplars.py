"""Exemplars: from a histogram bucket to the trace of a request in it.

A traced sidecar in front of the simulated engine; /metrics in OpenMetrics (what Prometheus
asks for with exemplar storage on) carries, on the TTFT, TPOT, duration and ITL buckets, the
trace ids of requests whose spans the sidecar exported (so do the smoothness and token usage
ones); the Prometheus text format is
unchanged; a real Prometheus stores the exemplars and returns them from
``/api/v1/query_exemplars``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from llmobs.metrics.exposition import wants_openmetrics
from llmobs.telemetry import build_telemetry
from tests.support.prom import Prometheus, Target, needs_prometheus
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

MODEL = "sim-llama-3-8b"
ENGINE: dict[str, Any] = {
    "model": MODEL, "prefill_base": 0.002, "prefill_per_token": 0.0, "decode_base": 0.002,
    "decode_per_seq": 0.0, "output_tokens_min": 6, "output_tokens_max": 6, "stall_every": 0,
}  # fmt: skip
# what Prometheus 2.42 sends when exemplar storage is on
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
TRACED = (
    "gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
    "gen_ai_server_request_duration_seconds", "llmobs_inter_token_latency_seconds",
    "llmobs_smoothness", "gen_ai_client_token_usage",
)  # fmt: skip
REQUESTS = 4


async def chats(side: SidecarHandle, count: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(f"{side.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
    await eventually(lambda: side.value("llmobs_requests_total") == count)


async def scrape(side: SidecarHandle, accept: str | None) -> tuple[str, str]:
    headers = {"Accept": accept} if accept is not None else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(side.metrics_url + "/metrics", headers=headers) as r,
    ):
        assert r.status == 200
        return r.headers["Content-Type"], await r.text()


def exemplar_traces(text: str) -> dict[str, set[str]]:
    """Histogram family -> the trace ids its buckets' exemplars name."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        for sample in family.samples:
            if sample.exemplar is not None:
                out.setdefault(family.name, set()).add(sample.exemplar.labels["trace_id"])
    return out


async def test_buckets_carry_the_traces_of_their_requests(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=exporter))
    await chats(side, REQUESTS)
    side.sidecar.flush_traces()
    traces = {format(s.context.trace_id, "032x") for s in exporter.get_finished_spans()}
    assert len(traces) == REQUESTS

    content_type, text = await scrape(side, PROMETHEUS_ACCEPT)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert text.endswith("# EOF\n")
    found = exemplar_traces(text)  # parsing it is the format check
    assert set(found) == set(TRACED)
    for name in TRACED:
        assert found[name] <= traces, name  # each names a trace that was exported
    # one exemplar per bucket, the latest: every TTFT fell in few buckets, so few remain
    assert 1 <= len(found[TRACED[0]]) <= REQUESTS

    # the Prometheus text format, the default, has none and is what it always was
    content_type, plain = await scrape(side, None)
    assert content_type.startswith("text/plain")
    assert " # {" not in plain and "# EOF" not in plain
    assert (await scrape(side, "text/plain;version=0.0.4"))[1] == plain


async def test_an_untraced_sidecar_has_no_exemplars(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url)
    await chats(side, 2)
    _, text = await scrape(side, PROMETHEUS_ACCEPT)
    assert exemplar_traces(text) == {}
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in text


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        ("", False),
        ("*/*", False),
        ("text/plain;version=0.0.4", False),
        (PROMETHEUS_ACCEPT, True),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text;q=0.3,text/plain;q=0.9", False),
        ("text/plain;q=0.5, application/openmetrics-text;version=1.0.0", True),
        ("application/openmetrics-text;q=0", False),
        ("application/json", False),
    ],
)
def test_content_negotiation(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept) is openmetrics


@needs_prometheus
async def test_prometheus_stores_the_exemplars(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sim = await start_sim(**ENGINE)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=exporter))
    targets = [Target("llmobs", side.metrics_url, {"namespace": "ci", "pod": "llm-0"})]
    async with Prometheus(tmp_path, targets, features=["exemplar-storage"]) as prom:
        await chats(side, REQUESTS)
        side.sidecar.flush_traces()
        traces = {format(s.context.trace_id, "032x") for s in exporter.get_finished_spans()}
        deadline = asyncio.get_running_loop().time() + 30
        stored: set[str] = set()
        while not stored:
            assert asyncio.get_running_loop().time() < deadline, "no exemplar stored"
            await asyncio.sleep(0.5)
            data = await prom.api(
                "query_exemplars",
                query="gen_ai_server_time_to_first_token_seconds_bucket",
                start="0",
                end="9999999999",
            )
            stored = {e["labels"]["trace_id"] for series in data for e in series["exemplars"]}
    assert stored <= traces
