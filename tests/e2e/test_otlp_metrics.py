"""Request metrics pushed over OTLP (``OTEL_METRICS_EXPORTER=otlp``), as a receiver decodes
them: the latency histograms as base-2 exponential histograms with the scale and the counts of
the native series /metrics serves for the same requests; explicit buckets when the spec's
variable asks for them."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from llmobs.config.otel import otel_settings
from llmobs.export.metrics.catalogue import TTFT
from llmobs.export.telemetry import build_telemetry
from tests.support.otlp import OtlpReceiver, attributes
from tests.support.servers import AppFactory, SidecarFactory, SimFactory, eventually

REQUESTS = 12


async def pushed(start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory,
                 **env: str) -> tuple[Any, Any]:  # fmt: skip
    """A sidecar pushing to a receiver; (the receiver, the sidecar) after REQUESTS requests
    with TTFTs spread by their prompts' lengths and one flush."""
    receiver = OtlpReceiver()
    url = await start_app(receiver.app())
    otel = otel_settings({"OTEL_METRICS_EXPORTER": "prometheus,otlp",
                          "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url + "/v1/metrics",
                          "OTEL_TRACES_EXPORTER": "none", **env})  # fmt: skip
    sim = await start_sim(prefill_base=0.005, prefill_per_token=0.0004, decode_base=0.002,
                          output_tokens_min=3, output_tokens_max=3)  # fmt: skip
    telemetry = build_telemetry(otel=otel)
    side = await start_sidecar(sim.url, telemetry=telemetry)
    async with aiohttp.ClientSession() as session:
        for i in range(REQUESTS):
            body = {"model": "m", "stream": True,
                    "messages": [{"role": "user", "content": "word " * (20 * i + 1)}]}  # fmt: skip
            async with session.post(side.url + "/v1/chat/completions", json=body) as r:
                await r.read()
    await eventually(lambda: side.value("llmobs_requests_total") == REQUESTS)
    # the last export, while the receiver is up (the readers stop with their providers)
    await asyncio.to_thread(telemetry.shutdown)
    return receiver, side


async def test_latency_histograms_go_out_exponential_as_the_native_series(
    start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory
) -> None:
    receiver, side = await pushed(start_sim, start_sidecar, start_app)
    metric = receiver.metrics(TTFT.name)[-1]  # the last export: every request in it
    assert metric.WhichOneof("data") == "exponential_histogram"
    (point,) = metric.exponential_histogram.data_points
    assert attributes(point)["gen_ai.request.model"] == "m" and point.count == REQUESTS
    assert attributes(point)["gen_ai.provider.name"] == "unknown"  # as the series' label
    native = side.sink.families[TTFT].natives[("chat", "m", "unknown")]
    assert point.scale == native.schema == 5  # OTel's scale is Prometheus' schema
    # OTel's bucket i holds (base^i, base^(i+1)]: Prometheus' bucket i + 1
    pushed_buckets = {point.positive.offset + i + 1: c
                      for i, c in enumerate(point.positive.bucket_counts) if c}  # fmt: skip
    assert pushed_buckets == native.positive
    assert point.zero_count == native.zero


async def test_explicit_buckets_when_the_spec_variable_asks(
    start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory
) -> None:
    receiver, _ = await pushed(
        start_sim, start_sidecar, start_app,
        OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION="explicit_bucket_histogram",
    )  # fmt: skip
    metric = receiver.metrics(TTFT.name)[-1]  # the last export: every request in it
    assert metric.WhichOneof("data") == "histogram"
    (point,) = metric.histogram.data_points
    assert list(point.explicit_bounds) == list(TTFT.buckets) and point.count == REQUESTS
