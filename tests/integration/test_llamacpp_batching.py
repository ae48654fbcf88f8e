"""llama-server with two slots: requests decoded together (continuous batching), more queued in
the engine, and what the engine says about itself (its /metrics, ``usage``, ``timings``, its
errors) held against what the sidecar measured of the same requests.

The sidecar scrapes the engine's /metrics every 100 ms (its engine collector), so the engine's
own queue is visible next to the sidecar's prefill queue depth. Run with ``-rP`` to see the
figures.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from llmobs.collectors.engine import read_engine
from tests.integration.client import CHAT, COMPLETIONS, Call
from tests.integration.conftest import Traced
from tests.integration.llamacpp import (
    CONTEXT,
    MODEL,
    LlamaServer,
    engine_metrics,
    masked,
    metrics_text,
    needs_llamacpp,
)
from tests.support.prom import ROOT
from tests.support.servers import SidecarFactory, SidecarHandle, eventually

pytestmark = [pytest.mark.integration, needs_llamacpp]

SLOTS = 2
SIDECAR = {"engine_scrape_interval": 0.1}
FIXTURES = ROOT / "tests" / "fixtures"


def report(line: str) -> None:
    """What was measured, shown with ``pytest -rP``."""
    print(line)


def chat(text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "seed": 0, "stream": True, **extra}  # fmt: skip


async def sample_while(
    side: SidecarHandle, work: asyncio.Future[Any], every: float = 0.02
) -> list[dict[str, float]]:
    """The sidecar's queue depth and the engine gauges it re-exports, until ``work`` is done."""
    rows = []
    while not work.done():
        rows.append({
            "queue": side.value("llmobs_prefill_queue_depth"),
            "waiting": side.value("llmobs_engine_requests_waiting", engine="llamacpp"),
            "running": side.value("llmobs_engine_requests_running", engine="llamacpp"),
        })  # fmt: skip
        await asyncio.sleep(every)
    return rows


async def test_queue_in_the_sidecar_and_in_the_engine(engine: LlamaServer, traced: Traced) -> None:
    side = traced.side
    waiting = 2  # N + k requests against N slots: k wait in the engine
    calls = [Call(CHAT, f"{n}. Tell me about {w}.", 24, MODEL)
             for n, w in enumerate(("rivers", "lanterns", "orchards", "falcons"))]  # fmt: skip
    assert len(calls) == SLOTS + waiting
    await eventually(lambda: side.value("llmobs_collector_up", collector="engine") == 1)
    streams = asyncio.ensure_future(traced.streams(calls, concurrently=True))
    rows = await sample_while(side, streams)
    seen = await streams
    peak = {key: max(row[key] for row in rows) for key in ("queue", "waiting", "running")}
    # the sidecar: all four waited for a first token; the engine: two decoding, two deferred
    assert peak == {"queue": 4.0, "waiting": float(waiting), "running": float(SLOTS)}, rows
    # batching: the first two decode together, the other two wait for a slot
    order = sorted(seen, key=lambda s: s.sent + s.ttft)
    first_ends = sorted(s.sent + s.times[-1] for s in order[:SLOTS])
    assert order[1].sent + order[1].ttft < first_ends[0]
    assert all(s.sent + s.ttft > first_ends[0] for s in order[SLOTS:])
    # why the queued ones waited, from their spans: llama.cpp reports its prefill
    # (timings.prompt_ms) but not its queue, so the wait for a slot is in ``other``, not
    # guessed into a phase; and the phases sum to the TTFT the sidecar measured
    spans: dict[Any, dict[str, Any]] = {
        (x.attributes or {}).get("gen_ai.response.id"): dict(x.attributes or {})
        for x in traced.spans() if x.parent is None
    }  # fmt: skip
    for stream in order:
        attrs = spans[stream.id]
        assert tuple(attrs["llmobs.ttft.reported"]) == ("prefill",)
        parts = [attrs[f"llmobs.ttft.{p}"] for p in ("before_engine", "prefill", "other")]
        assert sum(parts) == pytest.approx(attrs["llmobs.time_to_first_token"], abs=1e-8)
    for stream in order[SLOTS:]:
        attrs = spans[stream.id]
        assert attrs["llmobs.ttft.other"] > 0.5 * attrs["llmobs.time_to_first_token"]
        assert attrs["llmobs.ttft.other"] > attrs["llmobs.ttft.prefill"]
    # and both gauges drain to 0 (the engine's at its next scrape)
    assert side.value("llmobs_prefill_queue_depth") == 0
    await eventually(lambda: side.value("llmobs_engine_requests_running", engine="llamacpp") == 0)
    assert side.value("llmobs_engine_requests_waiting", engine="llamacpp") == 0
    report(
        f"{len(calls)} streams, {SLOTS} slots: TTFT "
        f"{', '.join(f'{1000 * s.ttft:.0f}' for s in order)} ms; peaks {peak}; "
        f"{len(rows)} samples"
    )


async def read_stream(url: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """POST a streaming request; its status and its events' JSON objects."""
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
        raw = await r.read()
    events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    return r.status, events


async def test_counts_and_times_agree_with_usage_and_timings(traced: Traced) -> None:
    side = traced.side
    body = chat("Name five birds and say why each one sings.", 40,
                stream_options={"include_usage": True})  # fmt: skip
    status, events = await read_stream(side.url + CHAT, body)
    assert status == 200
    (last,) = [e for e in events if "usage" in e]
    usage, timings = last["usage"], last["timings"]
    await eventually(lambda: side.value("llmobs_requests_total", outcome="ok") == 1)
    # token counts: the engine's usage, taken from the stream
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                      token_count_source="usage") == usage["completion_tokens"]  # fmt: skip
    assert side.value("llmobs_tokens_total", gen_ai_token_type="input") == usage["prompt_tokens"]
    # times: the engine's prefill is inside the sidecar's TTFT, and kept as the engine's own
    ttft = side.value("gen_ai_server_time_to_first_token_seconds_sum")
    prefill = timings["prompt_ms"] / 1000
    assert side.value("llmobs_engine_prompt_eval_duration_seconds_sum") == pytest.approx(prefill)
    assert prefill <= ttft < prefill + 0.5, (prefill, ttft)
    # TTFT in phases: the prefill phase is the engine's timings.prompt_ms, and the phases sum
    # to the TTFT measured (llama.cpp reports no queue: a free slot, its wait is in other)
    # (capped at what the sidecar measured after forwarding: the engine's clock may count a
    # millisecond more than fits, and the phases must still sum to the TTFT)
    phase = "llmobs_ttft_phase_duration_seconds_sum"
    before = side.value(phase, phase="before_engine")
    assert side.value(phase, phase="prefill") == pytest.approx(
        min(prefill, ttft - before), abs=1e-6
    )
    assert side.value(phase, phase="queue") == 0
    phases = sum(side.value(phase, phase=p) for p in ("before_engine", "prefill", "other"))
    assert phases == pytest.approx(ttft, abs=1e-6)
    # decode: the sidecar's TPOT against the engine's time per predicted token
    tpot = side.value("gen_ai_server_time_per_output_token_seconds_sum")
    engine_tpot = timings["predicted_per_token_ms"] / 1000
    assert tpot == pytest.approx(engine_tpot, rel=0.25), (tpot, engine_tpot)
    report(
        f"usage {usage}; engine prefill {1000 * prefill:.1f} ms, sidecar TTFT "
        f"{1000 * ttft:.1f} ms; engine {1000 * engine_tpot:.2f} ms per token, sidecar TPOT "
        f"{1000 * tpot:.2f} ms"
    )


async def until(check: Callable[[], bool], within: float) -> float:
    """Seconds until ``check()`` holds, polling every 10 ms; fails after ``within``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within, f"not within {within} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_client_that_leaves_frees_its_slot(engine: LlamaServer, traced: Traced) -> None:
    side = traced.side
    body = chat("Write a long story about a harbor at night.", 400)
    async with aiohttp.ClientSession() as session:
        response = await session.post(side.url + CHAT, json=body)
        for _ in range(5):  # a few tokens in
            assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
        assert engine_metrics(engine.url)["llamacpp:requests_processing"] == 1
        response.close()  # the client goes away mid-stream
        freed = await until(
            lambda: engine_metrics(engine.url)["llamacpp:requests_processing"] == 0, within=1.0
        )
    await eventually(lambda: side.value("llmobs_requests_total", outcome="client_disconnect") == 1)
    report(f"slot freed {1000 * freed:.0f} ms after the client left")


async def test_prompt_over_the_context_gets_the_engines_error(
    engine: LlamaServer, traced: Traced
) -> None:
    side = traced.side
    body = {"model": MODEL, "prompt": "word " * (CONTEXT + 500), "max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(engine.url + COMPLETIONS, json=body) as r:
            direct = (r.status, r.headers["Content-Type"], await r.read())
        async with session.post(side.url + COMPLETIONS, json=body) as r:
            relayed = (r.status, r.headers["Content-Type"], await r.read())
    assert relayed == direct  # the engine's own error, unchanged
    status, _, raw = relayed
    error = json.loads(raw)["error"]
    assert status == 400 and error["type"] == "exceed_context_size_error", raw
    assert error["n_ctx"] == CONTEXT
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    labels = {"outcome": "ok", "status_class": "4xx", "finish_reason": "error",
              "gen_ai_operation_name": "text_completion"}  # fmt: skip
    assert side.value("llmobs_requests_total", **labels) == 1
    assert side.value("gen_ai_server_time_to_first_token_seconds_count") == 0


def test_collector_reads_the_real_metrics(engine: LlamaServer) -> None:
    """The engine collector against llama-server's own /metrics, and the captured copy the
    unit tests read (tests/fixtures/engines/): the same names, the same reading."""
    text = metrics_text(engine.url)
    reading = read_engine(text)
    assert reading is not None and reading.engine == "llamacpp"
    assert (reading.waiting, reading.running) == (0.0, 0.0)
    # llama.cpp has no KV-cache gauge any more (llamacpp:kv_cache_usage_ratio is gone)
    assert reading.kv_usage is None and "kv_cache" not in text
    captured = (FIXTURES / "engines" / "llamacpp-server.metrics.txt").read_text()
    names = {line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names == {line.split(" ")[2] for line in captured.splitlines()
                     if line.startswith("# TYPE")}  # fmt: skip


async def test_inject_usage_leaves_the_clients_bytes_as_the_engine_sends_them(
    engine: LlamaServer, start_sidecar: SidecarFactory
) -> None:
    """--inject-usage asks llama-server for usage; with usage on, it moves its timings from
    the finish chunk to the usage event. The client still gets what it asked for."""
    side = await start_sidecar(engine.url, inject_usage=True)
    body = chat("Name three rivers.", 12)
    async with aiohttp.ClientSession() as session:
        async with session.post(engine.url + CHAT, json=body) as r:
            direct = await r.read()
        async with session.post(side.url + CHAT, json=body) as r:
            relayed = await r.read()
    assert b'"usage"' not in direct and direct.count(b'"timings"') == 1
    assert masked(relayed) == masked(direct)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                      token_count_source="usage") == 12  # fmt: skip
