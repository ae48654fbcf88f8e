"""Service-level objectives end to end: the simulated engine with a known prefill time per
prompt token and per-request faults, so that which requests are good is known exactly; the
sidecar's SLO series, its spans' verdicts and tail sampling, and ``llmobs slo`` reading the
sidecar's /metrics and a real Prometheus."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.export.telemetry import build_telemetry
from llmobs.sim.faults import FAULT_HEADER
from llmobs.tools.slo.attainment import rows_from_metrics
from tests.support.cli import cli
from tests.support.prom import RULES, Prometheus, Target, needs_prometheus, until
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

MODEL = "sim-llama-3-8b"
# prefill: 1 ms per prompt token (4 characters), decode 2 ms a step: a 2-token prompt has its
# first token within ~10 ms, a 600-token one after ~600 ms; the bound is 300 ms
ENGINE: dict[str, Any] = {
    "model": MODEL, "prefill_base": 0.002, "prefill_per_token": 0.001, "decode_base": 0.002,
    "decode_per_seq": 0.0, "output_tokens_min": 8, "output_tokens_max": 8, "fault": "header",
}  # fmt: skip
SLO: dict[str, Any] = {"slo_ttft": 0.3, "slo_target": 0.9}
SHORT, LONG = "hi", "word " * 480  # ~1 and ~600 prompt tokens
GOOD, SLOW, FAILED = 6, 2, 1
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # sampled by the client


async def chat(
    session: aiohttp.ClientSession, url: str, prompt: str, headers: dict[str, str] | None = None
) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True}
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            return r.status
    except aiohttp.ClientPayloadError:
        return -1  # the engine reset the stream: the client saw it cut


async def traffic(side: SidecarHandle) -> None:
    """GOOD short prompts (one of them in a trace the client sampled), SLOW long ones, FAILED
    streams reset mid-way, and two requests judged in neither series (a 404, an unknown
    fault's 400)."""
    async with aiohttp.ClientSession() as session:
        for i in range(GOOD):
            headers = {"traceparent": PARENT} if i == 0 else None
            assert await chat(session, side.url, SHORT, headers) == 200
        for _ in range(SLOW):
            assert await chat(session, side.url, LONG) == 200
        for _ in range(FAILED):
            await chat(session, side.url, SHORT, {FAULT_HEADER: "reset-mid-stream"})
        async with session.get(f"{side.url}/v1/nothing-here") as r:
            assert r.status == 404
        assert await chat(session, side.url, SHORT, {FAULT_HEADER: "no-such-fault"}) == 400


ALL = GOOD + SLOW + FAILED + 2  # every request, each with its one outcome


async def metrics_text(side: SidecarHandle) -> str:
    async with aiohttp.ClientSession() as session, session.get(side.metrics_url + "/metrics") as r:
        return await r.text()


async def test_requests_are_judged_exactly_and_bad_traces_kept(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(
        sim.url, build_telemetry(span_exporter=exporter), traces_good_ratio=0.0, **SLO
    )
    await traffic(side)
    await eventually(lambda: side.value("llmobs_requests_total") == ALL)
    rows = rows_from_metrics(await metrics_text(side))
    row = rows[("chat", MODEL, "")]
    assert (row.good, row.bad) == (GOOD, SLOW + FAILED)
    assert row.misses == {"ttft": SLOW, "error": FAILED}
    assert row.target == 0.9
    assert row.good_tokens == GOOD * 8
    # the 404 (operation other) and the 400 are in neither series
    assert sum(r.judged for r in rows.values()) == GOOD + SLOW + FAILED

    # spans: every bad request's, and the good one the client sampled; no other good one
    side.sidecar.flush_traces()
    servers = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    attributes: list[dict[str, Any]] = [dict(s.attributes or {}) for s in servers]
    verdicts = sorted(
        (a.get("llmobs.slo.verdict"), tuple(a.get("llmobs.slo.missed", ()))) for a in attributes
    )
    assert verdicts == sorted(
        [("bad", ("ttft",))] * SLOW + [("bad", ("error",))] * FAILED + [("good", ())]
    )
    kept_good = [
        s for s in servers if s.attributes and s.attributes["llmobs.slo.verdict"] == "good"
    ]
    assert [format(s.context.trace_id, "032x") for s in kept_good] == [PARENT.split("-")[1]]

    # the gate: 6 of 9 good is below 0.9; at 0.5 it passes
    metrics = side.metrics_url + "/metrics"
    code, text = await asyncio.to_thread(cli, "slo", "--metrics-url", metrics)
    assert code == 1, text
    assert "66.667%" in text and "ttft 2, error 1" in text and "objectives missed" in text
    code, text = await asyncio.to_thread(cli, "slo", "--metrics-url", metrics, "--target", "0.5")
    assert code == 0 and "all objectives met" in text, text
    code, text = await asyncio.to_thread(
        cli, "slo", "--metrics-url", metrics, "--target", "0.5", "--json"
    )
    assert (code, json.loads(text)["outcome"]) == (0, "met"), text
    code, text = await asyncio.to_thread(cli, "slo", "--metrics-url", metrics, "--json")
    report = json.loads(text)
    assert code == 1 and report["passed"] is False and report["outcome"] == "missed"
    (label_set,) = [r for r in report["label_sets"] if r["model"] == MODEL]
    assert label_set["misses"] == {"ttft": SLOW, "error": FAILED}


@needs_prometheus
async def test_the_gate_reads_prometheus_over_a_range(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url, **SLO)
    targets = [Target("llmobs", side.metrics_url, {"namespace": "ci", "pod": "llm-0"})]
    async with Prometheus(tmp_path, targets) as prom, aiohttp.ClientSession() as session:
        # a first request makes the label set's series (at 0 for bad): scraped before the rest,
        # so that increase() over the range sees all of it
        assert await chat(session, side.url, SHORT) == 200
        await until(prom, 'sum(llmobs_slo_requests_total{verdict="bad"})', 0)
        await traffic(side)
        await until(prom, 'sum(llmobs_slo_requests_total{verdict="bad"})', SLOW + FAILED)
        code, text = await asyncio.to_thread(cli, "slo", "--prometheus", prom.url, "--range", "5m")
    assert code == 1, text
    assert "ttft" in text and "error" in text and MODEL in text


@needs_prometheus
async def test_a_first_burst_of_errors_burns_the_budget(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """An engine that fails every request from the start, for a model never admitted
    (``other``): the label set's series were there at 0 before the burst, so the shipped
    burn-rate rules see it as an increase, a ratio of 1, not a series born at its count."""
    sim = await start_sim(**{**ENGINE, "fault": "none"}, error_rate=1.0)
    side = await start_sidecar(sim.url, **SLO)
    targets = [Target("llmobs", side.metrics_url, {"namespace": "ci", "pod": "llm-0"})]
    ratio = (
        'namespace_job_operation_model:llmobs_slo_errors:ratio_rate5m{gen_ai_request_model="other"}'
    )
    async with (
        Prometheus(tmp_path, targets, {"rules.yml": RULES.read_text()}) as prom,
        aiohttp.ClientSession() as session,
    ):
        # the sidecar's first scrape, before any request: other's series at 0
        await until(prom, 'sum(llmobs_slo_requests_total{gen_ai_request_model="other"})', 0)
        statuses = await asyncio.gather(*(chat(session, side.url, SHORT) for _ in range(5)))
        assert statuses == [500] * 5
        await until(prom, 'sum(llmobs_slo_requests_total{gen_ai_request_model="other"})', 5)
        await until(prom, f"max({ratio})", 1.0)
        misses = await prom.query(
            'sum(increase(llmobs_slo_misses_total{gen_ai_request_model="other",'
            'objective="error"}[5m]))'
        )
    assert misses and misses[0][1] >= 5
