"""Why a first token was slow, against the truth: the simulated engine queues requests behind
a batch of one and reports each one's queue and prefill as vLLM's per-request ``metrics`` do
(the schedule's own times); the sidecar's TTFT phases on each request's span and histogram must
hold the engine's report, sum to the TTFT it measured, and leave only loopback in ``other``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.export.telemetry import build_telemetry
from tests.support.servers import SidecarFactory, SimFactory, eventually

SCHEDULE: dict[str, Any] = {
    "max_batch": 1, "prefill_base": 0.05, "prefill_per_token": 0.0, "decode_base": 0.01,
    "decode_per_seq": 0.0, "output_tokens_min": 5, "output_tokens_max": 5,
}  # fmt: skip
REQUESTS = 4
# generous: what a busy 2-core machine adds between engine and sidecar (a hiccup of the
# host's included), and still under one request's wait in the engine's queue
LOOPBACK_S = 0.075


async def stream(url: str) -> tuple[str, dict[str, float] | None]:
    """One streaming chat request; its response id and the engine's ``metrics``, if any."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    rid, metrics = "", None
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                rid = event.get("id", rid)
                metrics = event.get("metrics", metrics)
    return rid, metrics


def phases_of(span: Any) -> dict[str, float]:
    attrs = span.attributes or {}
    return {k.removeprefix("llmobs.ttft."): v for k, v in attrs.items()
            if k.startswith("llmobs.ttft.") and k != "llmobs.ttft.reported"}  # fmt: skip


async def run(start_sim: SimFactory, start_sidecar: SidecarFactory, metrics: bool) -> Any:
    sim = await start_sim(**SCHEDULE, per_request_metrics=metrics)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(sim.url, telemetry=build_telemetry(span_exporter=exporter))
    answers = await asyncio.gather(*(stream(side.url) for _ in range(REQUESTS)))
    await eventually(lambda: side.value("llmobs_requests_total") == REQUESTS)
    side.sidecar.flush_traces()
    spans = [s for s in exporter.get_finished_spans() if (s.attributes or {}).get(
        "gen_ai.response.id")]  # fmt: skip
    assert len(spans) == REQUESTS
    return side, dict(answers), spans


async def test_the_phases_hold_the_engines_report_and_sum_to_ttft(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    side, truth, spans = await run(start_sim, start_sidecar, metrics=True)
    queues = []
    for span in spans:
        attrs = span.attributes or {}
        reported = truth[attrs["gen_ai.response.id"]]
        assert reported is not None
        phases = phases_of(span)
        assert list(attrs["llmobs.ttft.reported"]) == ["queue", "prefill"]
        # the engine's own figures, to the nanosecond they were rounded to
        assert phases["queue"] == pytest.approx(reported["queue_time_ms"] / 1000, abs=1e-6)
        assert phases["prefill"] == pytest.approx(
            reported["time_to_first_token_ms"] / 1000, abs=1e-6)  # fmt: skip
        # they and what the sidecar measured sum to the TTFT it measured
        assert sum(phases.values()) == pytest.approx(attrs["llmobs.time_to_first_token"], abs=1e-8)
        assert 0 <= phases["before_engine"] < LOOPBACK_S
        assert 0 <= phases["other"] < LOOPBACK_S
        queues.append(phases["queue"])
    # one batch slot: each request waits for those before it (about 0.1 s each)
    queues.sort()
    assert queues[0] < 0.02 and queues[-1] > 0.25
    assert side.value("llmobs_ttft_phase_duration_seconds_count", phase="queue") == REQUESTS
    assert side.value("llmobs_ttft_phase_duration_seconds_count", phase="load") == 0


async def test_an_engine_that_reports_nothing_gets_no_guessed_phase(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    side, truth, spans = await run(start_sim, start_sidecar, metrics=False)
    assert set(truth.values()) == {None}
    for span in spans:
        attrs = span.attributes or {}
        assert list(attrs["llmobs.ttft.reported"]) == []
        phases = phases_of(span)
        assert set(phases) == {"before_engine", "other"}
        assert sum(phases.values()) == pytest.approx(attrs["llmobs.time_to_first_token"], abs=1e-8)
    assert side.value("llmobs_ttft_phase_duration_seconds_count", phase="queue") == 0
    assert side.value("llmobs_ttft_phase_duration_seconds_count", phase="other") == REQUESTS
