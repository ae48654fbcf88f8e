"""Exemplars: from a histogram bucket to the trace of a request in it.

A traced sidecar in front of the simulated engine, exporting its spans over OTLP/HTTP to a
receiver on loopback; /metrics in OpenMetrics (what Prometheus
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
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from llmobs.config.otel import otel_settings
from llmobs.export.telemetry import Telemetry, build_telemetry
from tests.support.otlp import OtlpReceiver
from tests.support.prom import Prometheus, Target, needs_prometheus
from tests.support.servers import (
    AppFactory,
    SidecarFactory,
    SidecarHandle,
    SimFactory,
    eventually,
)

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
    "llmobs_smoothness", "gen_ai_client_token_usage", "llmobs_ttft_phase_duration_seconds",
)  # fmt: skip
REQUESTS = 4


async def exporting(start_app: AppFactory) -> tuple[OtlpReceiver, Telemetry]:
    """A receiver on loopback, and telemetry that exports spans to it."""
    receiver = OtlpReceiver()
    url = await start_app(receiver.app())
    otel = otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "50"})
    return receiver, build_telemetry(otel=otel)


async def received(side: SidecarHandle, receiver: OtlpReceiver, count: int) -> set[str]:
    """The trace ids the receiver got, once it has the ``count`` requests' server spans."""
    await asyncio.to_thread(side.sidecar.flush_traces)
    await eventually(lambda: len(receiver.trace_ids()) >= count)
    return receiver.trace_ids()


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
                # OpenMetrics: an exemplar's label set is at most 128 UTF-8 characters
                labels = sample.exemplar.labels
                assert sum(len(k) + len(v) for k, v in labels.items()) <= 128
                assert set(labels) == {"trace_id", "span_id"}
                out.setdefault(family.name, set()).add(sample.exemplar.labels["trace_id"])
    return out


async def test_buckets_carry_the_traces_of_their_requests(
    start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory
) -> None:
    receiver, telemetry = await exporting(start_app)
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url, telemetry)
    await chats(side, REQUESTS)
    traces = await received(side, receiver, REQUESTS)
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
    again = (await scrape(side, "text/plain;version=0.0.4"))[1]
    assert requests_only(again) == requests_only(plain)


def requests_only(text: str) -> str:
    """The exposition without the sidecar's own process and Python series and its
    collectors' (they change from one scrape to the next: a GPU poll may fall between two)."""
    own = tuple(f"{prefix}{name}" for prefix in ("", "# HELP ", "# TYPE ")
                for name in ("process_", "python_", "llmobs_collector_"))  # fmt: skip
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(own))


async def test_an_untraced_sidecar_has_no_exemplars(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url)
    await chats(side, 2)
    _, text = await scrape(side, PROMETHEUS_ACCEPT)
    assert exemplar_traces(text) == {}
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in text


@needs_prometheus
async def test_prometheus_stores_the_exemplars(
    start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory, tmp_path: Path
) -> None:
    receiver, telemetry = await exporting(start_app)
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url, telemetry)
    targets = [Target("llmobs", side.metrics_url, {"namespace": "ci", "pod": "llm-0"})]
    async with Prometheus(tmp_path, targets, features=["exemplar-storage"]) as prom:
        await chats(side, REQUESTS)
        traces = await received(side, receiver, REQUESTS)
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
