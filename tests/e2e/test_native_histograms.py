"""Native histograms, end to end, against the Debian Prometheus (2.42).

A traced sidecar in front of the simulated engine, its spans exported over OTLP/HTTP to a
receiver on loopback. Prometheus with ``--enable-feature=exemplar-storage,native-histograms``
asks for the protobuf format and ingests the native buckets; its ``histogram_quantile`` over
them lands within 3 % of the exact quantiles of the requests (their TTFT, TPOT, duration and
smoothness as the spans carry them), where the classic buckets can miss by the width of a
bucket. Its exemplars name traces the receiver got. A second Prometheus without the features
scrapes the classic series, which are the text exposition's, unchanged.

Prometheus 2.42 keeps only the native series of a histogram it gets both ways (2.45's
``scrape_classic_histograms``, 3.x's ``always_scrape_classic_histograms`` keep both), and only
one exemplar per histogram and scrape: docs/metrics.md says what that means for dashboards.
"""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from llmobs.config.otel import otel_settings
from llmobs.export.telemetry import build_telemetry
from tests.support.otlp import OtlpReceiver, attributes
from tests.support.prom import Prometheus, Target, needs_prometheus, until
from tests.support.servers import (
    AppFactory,
    SidecarFactory,
    SidecarHandle,
    SimFactory,
    eventually,
)

MODEL = "sim-llama-3-8b"
# A batching engine with prompts of many lengths, a few stalls and uneven outputs: TTFT from
# ~50 ms to ~0.65 s (queueing included), TPOT, duration and smoothness spread as well.
ENGINE: dict[str, Any] = {
    "model": MODEL, "max_batch": 4, "prefill_base": 0.04, "prefill_per_token": 0.002,
    "decode_base": 0.012, "decode_per_seq": 0.003, "output_tokens_min": 4,
    "output_tokens_max": 14, "stall_every": 9, "stall_ms": 60,
}  # fmt: skip
REQUESTS = 40
CONCURRENCY = 4
QUANTILES = (0.5, 0.9, 0.99)
# metric -> the span attribute that holds each request's exact value (None: the span's length)
MEASURED = {
    "gen_ai_server_time_to_first_token_seconds": "llmobs.time_to_first_token",
    "gen_ai_server_time_per_output_token_seconds": "llmobs.time_per_output_token",
    "llmobs_smoothness": "llmobs.smoothness",
    "gen_ai_server_request_duration_seconds": None,
}
TOLERANCE = 0.03


async def load(side: SidecarHandle) -> None:
    """``REQUESTS`` streaming chats, ``CONCURRENCY`` at a time, prompts 1 to 150 tokens."""
    rng = random.Random(25)
    prompts = ["x" * 4 * rng.randint(1, 150) for _ in range(REQUESTS)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            prompt = queue.get_nowait()
            body = {"model": MODEL, "stream": True,
                    "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
            async with session.post(f"{side.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(CONCURRENCY)))
    await eventually(lambda: side.value("llmobs_requests_total") == REQUESTS)


def exact(values: list[float], q: float) -> float:
    """The q-quantile as Prometheus ranks it: the smallest value with at least q of them at
    or below it (numpy's ``inverted_cdf``)."""
    return float(np.quantile(values, q, method="inverted_cdf"))


def measured(receiver: OtlpReceiver) -> dict[str, list[float]]:
    """Each request's exact values, from its server span."""
    out: dict[str, list[float]] = {name: [] for name in MEASURED}
    for span, _ in receiver.spans():
        attrs = attributes(span)
        if attrs.get("gen_ai.request.model") != MODEL or "llmobs.outcome" not in attrs:
            continue
        for name, attribute in MEASURED.items():
            if attribute is None:
                out[name].append((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9)
            elif attribute in attrs:
                out[name].append(float(attrs[attribute]))
    return out


def classic_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name not in MEASURED:
            continue
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items()}
            if "le" in labels:
                labels["le"] = repr(float(labels["le"]))
            out[(s.name, frozenset(labels.items()))] = float(s.value)
    return out


@needs_prometheus
async def test_native_quantiles_within_3_percent_and_exemplars_to_received_traces(
    start_sim: SimFactory,
    start_sidecar: SidecarFactory,
    start_app: AppFactory,
    tmp_path: Path,
) -> None:
    receiver = OtlpReceiver()
    collector = await start_app(receiver.app())
    otel = otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": collector,
                          "OTEL_BSP_SCHEDULE_DELAY": "50"})  # fmt: skip
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url, build_telemetry(otel=otel))
    target = [Target("llmobs", side.metrics_url, {"pod": "llm-0"})]
    (tmp_path / "native").mkdir()
    (tmp_path / "classic").mkdir()
    native = Prometheus(tmp_path / "native", target, features=["exemplar-storage",
                                                                "native-histograms"])  # fmt: skip
    classic = Prometheus(tmp_path / "classic", target)
    async with native, classic:
        await load(side)
        await asyncio.to_thread(side.sidecar.flush_traces)
        await eventually(lambda: len(measured(receiver)["llmobs_smoothness"]) == REQUESTS)
        for name in MEASURED:  # a scrape after the last request
            await until(native, f"histogram_count({name})", REQUESTS)
            await until(classic, f"{name}_count", REQUESTS)
        # Quantiles: native within 3 %; classic as far off as its buckets make it
        values = measured(receiver)
        report = []
        for name, observed in values.items():
            assert len(observed) == REQUESTS, name
            for q in QUANTILES:
                want = exact(observed, q)
                [(_, got)] = await native.query(f"histogram_quantile({q}, {name})")
                [(_, old)] = await classic.query(f"histogram_quantile({q}, {name}_bucket)")
                report.append(f"{name} p{q * 100:g}: exact {want:.4f} native {got:.4f} "
                              f"classic {old:.4f}")  # fmt: skip
                assert math.isclose(got, want, rel_tol=TOLERANCE), report[-1]
        print("\n".join(report))  # the figures docs/metrics.md quotes

        # Exemplars: Prometheus stored some, each names a trace the receiver got
        data = await native.api("query_exemplars", query=next(iter(MEASURED)),
                                start="0", end="9999999999")  # fmt: skip
        stored = {e["labels"]["trace_id"] for series in data for e in series["exemplars"]}
        assert stored and stored <= receiver.trace_ids()

        # The classic series: in the Prometheus without the features, the text format's
        async with (
            aiohttp.ClientSession() as session,
            session.get(side.metrics_url + "/metrics") as r,
        ):
            text = await r.text()
        want_samples = classic_samples(text)
        got_samples = {}
        for (name, labels), _ in want_samples.items():
            selector = ",".join(f'{k}="{v}"' for k, v in labels if k != "le")
            for metric, value in await classic.query(f"{name}{{{selector}}}"):
                metric.pop("__name__")
                metric.pop("job"), metric.pop("instance"), metric.pop("pod")
                if "le" in metric:
                    metric["le"] = repr(float(metric["le"]))
                got_samples[(name, frozenset(metric.items()))] = value
        assert got_samples == want_samples
        # ... and the native Prometheus (2.42) has the native series instead of them
        assert await native.query(f"{next(iter(MEASURED))}_bucket") == []
