"""The OpenTelemetry GenAI conventions as a user wires them: v1.41.0's names by default, the
newest with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` (read from the
environment as ``llmobs serve`` reads it), and ``gen_ai.provider.name`` from the engine the
collector recognises, from an engine's own API, or from ``--provider-name``; on /metrics, on
the spans, in a real Prometheus' view of the series."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.config.otel import otel_settings
from llmobs.export.telemetry import build_telemetry
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

OPT_IN = {"OTEL_SEMCONV_STABILITY_OPT_IN": "http, gen_ai_latest_experimental"}
SCHEDULE: dict[str, Any] = {"output_tokens_min": 6, "output_tokens_max": 6, "decode_base": 0.005}


async def chat(side: SidecarHandle, stream: bool) -> int:
    """One chat request; the prompt tokens the engine's usage says it read."""
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
            "stream": stream, "max_tokens": 6}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with (
        aiohttp.ClientSession() as s,
        s.post(side.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
        text = await r.text()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: {")]
    usages = [json.loads(e).get("usage") for e in events] if stream else [json.loads(text)["usage"]]
    (usage,) = [u for u in usages if u]
    prompt: int = usage["prompt_tokens"]
    return prompt


def names(scraped: dict[str, list[tuple[dict[str, str], float]]], prefix: str) -> set[str]:
    return {name for name in scraped if name.startswith(prefix)}


async def test_the_first_request_after_start_counts_under_the_engine(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """No series split at start: the proxy port opens once the engine collector's first
    scrape has named the engine, so a request sent the moment the sidecar is up is counted
    under vllm, and no series says unknown."""
    sim = await start_sim(**SCHEDULE)
    side = await start_sidecar(sim.url, engine_scrape_interval=60)
    assert side.sidecar.proxy.provider.name == "vllm"  # before anything is awaited
    await chat(side, stream=True)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    scraped = await side.scrape()
    ttft = [labels for labels, _ in scraped["gen_ai_server_time_to_first_token_seconds_count"]]
    assert {labels["gen_ai_provider_name"] for labels in ttft} == {"vllm"}


async def test_by_default_v1_41_names_with_the_engine_as_provider(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """The sim serves vLLM's metrics: the collector names it, and every GenAI series and span
    says vllm; the token usage is v1.41's histogram by type."""
    sim = await start_sim(**SCHEDULE)
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter, otel=otel_settings({}))
    side = await start_sidecar(sim.url, telemetry=telemetry, engine_scrape_interval=60)
    provider = side.sidecar.proxy.provider
    await eventually(lambda: provider.settled)
    assert provider.name == "vllm"
    await chat(side, stream=True)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    scraped = await side.scrape()
    ttft = [labels for labels, _ in scraped["gen_ai_server_time_to_first_token_seconds_count"]]
    assert {labels["gen_ai_provider_name"] for labels in ttft} == {"vllm"}
    assert side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output",
                      gen_ai_provider_name="vllm") == 6  # fmt: skip
    assert not names(scraped, "gen_ai_client_inference")
    requests = scraped["llmobs_requests_total"]
    assert all("gen_ai_provider_name" not in labels for labels, _ in requests)
    side.sidecar.flush_traces()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "chat sim-model"]
    attrs = span.attributes or {}
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.request.stream"] is True
    # the TTFT the histogram counted: one request, so its sum
    ttft_sum = side.value("gen_ai_server_time_to_first_token_seconds_sum")
    assert attrs["gen_ai.response.time_to_first_chunk"] == ttft_sum > 0


async def test_opted_in_the_newest_token_usage_and_nothing_of_v1_41s(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter, otel=otel_settings(OPT_IN))
    side = await start_sidecar(sim.url, telemetry=telemetry, provider_name="acme.llm")
    inputs = await chat(side, stream=True) + await chat(side, stream=False)
    await eventually(lambda: side.value("llmobs_requests_total") == 2)
    scraped = await side.scrape()
    assert not names(scraped, "gen_ai_client_token_usage")
    usage = {
        name: [(labels["gen_ai_provider_name"], labels["gen_ai_token_modality"], value)
               for labels, value in scraped[name] if value]
        for name in names(scraped, "gen_ai_client_inference_usage")
    }  # fmt: skip
    # the engine's usage: the sim's prompt of a few tokens, 6 out, per request
    assert inputs > 0
    assert usage["gen_ai_client_inference_usage_input_tokens_total"] == [
        ("acme.llm", "unknown", inputs)]  # fmt: skip
    assert usage["gen_ai_client_inference_usage_output_tokens_total"] == [
        ("acme.llm", "unknown", 12)]  # fmt: skip
    assert side.value("gen_ai_client_inference_operation_output_tokens_count") == 2
    assert side.value("gen_ai_client_inference_operation_output_tokens_sum") == 12
    side.sidecar.flush_traces()
    finished = exporter.get_finished_spans()
    spans = [s.attributes or {} for s in finished if s.name == "chat sim-model"]
    assert [a.get("gen_ai.request.stream") for a in spans] == [True, None]  # set iff streaming
    assert {a["gen_ai.provider.name"] for a in spans} == {"acme.llm"}


async def test_an_engine_without_metrics_is_named_by_its_own_api(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """No engine collector (as for Ollama, which serves no /metrics): until a request comes,
    the provider is unknown; the first Ollama request names it, and counts under it."""
    sim = await start_sim(dialect="ollama", **SCHEDULE)
    side = await start_sidecar(sim.url)
    assert side.sidecar.proxy.provider.name == "unknown"
    body = {"model": "sim-model", "prompt": "hi", "options": {"num_predict": 6}}
    async with aiohttp.ClientSession() as s, s.post(side.url + "/api/generate", json=body) as r:
        assert r.status == 200
        await r.read()
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.sidecar.proxy.provider.name == "ollama"
    scraped = await side.scrape()
    durations = [
        (labels["gen_ai_provider_name"], labels["gen_ai_request_model"], value)
        for labels, value in scraped["gen_ai_server_request_duration_seconds_count"]
    ]
    assert durations == [("ollama", "sim-model", 1)]
