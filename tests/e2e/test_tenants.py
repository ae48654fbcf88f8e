"""Who it was slow for, and what it cost: the real OpenAI SDK sends API keys and tenant headers
through the sidecar to the simulated engine; the per-tenant series are exact, each tenant is
judged by its own objective, the cost is the price file's arithmetic to the cent, hostile
tenant headers take no more than their slots, and no key appears in any output: not on
/metrics, in a span, in a log line or in the live page's data."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.config.tenants import fingerprint
from llmobs.export.telemetry import build_telemetry
from llmobs.tools.slo.attainment import rows_from_metrics
from tests.support.rawhttp import status_of
from tests.support.servers import (
    SidecarFactory,
    SidecarHandle,
    SimFactory,
    eventually,
    requests_shown,
)

MODEL = "sim-llama-3-8b"
KEY_A = "sk-team-a-0123456789abcdefSECRET"  # named in the key file: team-a
KEY_B = "sk-unnamed-9876543210fedcbaSECRET"  # not named: key-<12 hex>
KEY_H = "sk-with-header-5555SECRET"  # not named, but the request names its tenant
ENGINE: dict[str, Any] = {
    "model": MODEL, "prefill_base": 0.002, "prefill_per_token": 0.0, "decode_base": 0.002,
    "decode_per_seq": 0.0, "output_tokens_min": 5, "output_tokens_max": 12,
}  # fmt: skip
# per million tokens: large, so that every token is worth a fraction of a cent
PRICES = "currency: EUR\nprices:\n  {model}:\n    input: 1000\n    output: 3000\n"


async def chat(url: str, key: str, tenant: str | None = None) -> tuple[int, int]:
    """One streamed chat with the SDK; (input, output) tokens as the engine's usage says."""
    headers = {"X-Tenant-Id": tenant} if tenant is not None else None
    async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0,
                           default_headers=headers) as client:  # fmt: skip
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello."}], stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
    assert usage is not None
    return usage.prompt_tokens, usage.completion_tokens


async def start(
    tmp_path: Path, start_sim: SimFactory, start_sidecar: SidecarFactory
) -> tuple[SidecarHandle, InMemorySpanExporter]:
    keys = tmp_path / "tenants.yaml"
    keys.write_text(f"tenants:\n  {fingerprint(KEY_A)}: team-a\n")
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES.format(model=MODEL))
    slo = tmp_path / "slo.yaml"  # team-a's contract: a first token within 1 ms (missed)
    slo.write_text("objectives:\n  - tenant: team-a\n    ttft: 1ms\n    target: 0.99\n")
    sim = await start_sim(**ENGINE)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(
        sim.url, telemetry=build_telemetry(span_exporter=exporter), tenant_header="X-Tenant-Id",
        tenant_keys=str(keys), tenant_fingerprints=True, max_tenants=3, price_file=str(prices),
        slo_file=str(slo), tenant_metrics=("requests", "ttft", "slo", "tokens", "cost", "itl"),
    )  # fmt: skip
    return side, exporter


async def test_per_tenant_series_objectives_and_cost(
    tmp_path: Path, start_sim: SimFactory, start_sidecar: SidecarFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    side, exporter = await start(tmp_path, start_sim, start_sidecar)
    usage: list[tuple[int, int]] = []
    usage += await asyncio.gather(*(chat(side.url, KEY_A) for _ in range(3)))
    usage += await asyncio.gather(*(chat(side.url, KEY_B) for _ in range(2)))
    usage += await asyncio.gather(*(chat(side.url, KEY_H, "team-h") for _ in range(2)))
    # a key the file names is its tenant whatever header comes with it
    usage.append(await chat(side.url, KEY_A, "someone-else"))
    await eventually(lambda: side.value("llmobs_requests_total") == 8)

    unnamed = "key-" + fingerprint(KEY_B)[len("sha256:") :][:12]
    counts = {t: side.value("llmobs_requests_total", tenant=t)
              for t in ("team-a", unnamed, "team-h")}  # fmt: skip
    assert counts == {"team-a": 4, unnamed: 2, "team-h": 2}
    ttft = "gen_ai_server_time_to_first_token_seconds_count"
    assert side.value(ttft, tenant="team-a") == 4
    assert side.value("llmobs_inter_token_latency_seconds_count", tenant="team-h") > 0
    # each tenant judged by its own objective: team-a's 1 ms TTFT is missed, the rest good
    slo = "llmobs_slo_requests_total"
    assert side.value(slo, tenant="team-a", verdict="bad") == 4
    assert side.value(slo, tenant="team-h", verdict="good") == 2
    assert side.value("llmobs_slo_target", tenant="team-a") == 0.99
    assert side.value("llmobs_slo_target", tenant="team-h") == 0.999
    # tokens and cost: the engine's usage at the file's prices, to the cent
    inputs, outputs = sum(i for i, _ in usage), sum(o for _, o in usage)
    assert side.value("llmobs_tokens_total", token_count_source="usage",
                      gen_ai_token_type="output") == outputs  # fmt: skip
    expected = (inputs * 1000 + outputs * 3000) / 1e6
    assert side.value("llmobs_cost_total", currency="EUR") == pytest.approx(expected, abs=0.005)
    team_a = sum(1000 * i + 3000 * o for (i, o) in (usage[:3] + usage[-1:])) / 1e6
    assert side.value("llmobs_cost_total", tenant="team-a", verdict="bad") == pytest.approx(
        team_a, abs=0.005)  # fmt: skip

    side.sidecar.flush_traces()
    spans = exporter.get_finished_spans()
    tenants = {(s.attributes or {}).get("llmobs.tenant") for s in spans if s.parent is None}
    assert tenants == {"team-a", unnamed, "team-h"}
    costs = [(s.attributes or {}).get("llmobs.cost") for s in spans if s.parent is None]
    assert sum(c for c in costs if isinstance(c, float)) == pytest.approx(expected, abs=1e-9)

    # the gate reads tenants and costs too
    async with aiohttp.ClientSession() as session, session.get(side.metrics_url + "/metrics") as r:
        metrics = await r.text()
    # the live page once a tick has counted every request
    live = json.dumps(await side.live(lambda data: requests_shown(data) == 8))
    rows = rows_from_metrics(metrics)
    assert rows[("chat", MODEL, "team-a")].bad == 4
    assert rows[("chat", MODEL, "team-a")].cost == pytest.approx(team_a, abs=0.005)
    assert sum(v for v in json.loads(live)["models"][MODEL]["cost"] if v) == pytest.approx(
        expected, abs=0.005)  # fmt: skip

    # no key, no part of one, anywhere
    dump = repr([(s.name, s.attributes, [e.attributes for e in s.events]) for s in spans])
    logs = "\n".join(r.getMessage() for r in caplog.records)
    for key in (KEY_A, KEY_B, KEY_H):
        for where, text in (("metrics", metrics), ("spans", dump), ("logs", logs),
                            ("live page", live)):  # fmt: skip
            assert key not in text and key[-20:] not in text, where


async def test_hostile_tenant_headers_take_only_their_slots(
    tmp_path: Path, start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """A client naming a new tenant per request: three slots (``--max-tenants 3``), then
    ``other``; the key file's tenant keeps its own whatever the slots."""
    side, _ = await start(tmp_path, start_sim, start_sidecar)
    for i in range(12):
        await chat(side.url, KEY_H, f"evil-{i}")
    await chat(side.url, KEY_A)
    await eventually(lambda: side.value("llmobs_requests_total") == 13)
    scraped = await side.scrape()
    tenants = {labels.get("tenant") for labels, _ in scraped["llmobs_requests_total"]}
    assert tenants == {"evil-0", "evil-1", "evil-2", "other", "team-a"}
    assert side.value("llmobs_requests_total", tenant="other") == 9
    # and a rejected request (no observer saw it through) counts under unknown
    bad = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5x\r\n\r\n"
    assert await status_of(side.url, bad) == 400
    await eventually(lambda: side.value("llmobs_requests_total", tenant="unknown") == 1)
