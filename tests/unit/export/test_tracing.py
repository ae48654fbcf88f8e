"""Traces (``export.tracing``): span structure and attributes (in-memory exporter), context
propagation to the engine, token events and their cap, captured content, unsampled requests,
and tail sampling by verdict. How spans leave (the exporters, the bounded processor):
test_telemetry.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from llmobs.config.objectives import Objective
from llmobs.export.telemetry import Telemetry, build_telemetry
from llmobs.export.tracing import RequestMeta, Tracing
from llmobs.observe.dialects import OPENAI_CHAT
from llmobs.observe.record import RequestRecord
from llmobs.observe.slo import GOOD, Verdict
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SCHEDULE: dict[str, Any] = {
    "max_batch": 1, "prefill_base": 0.1, "prefill_per_token": 0.0, "decode_base": 0.02,
    "decode_per_seq": 0.0, "output_tokens_min": 30, "output_tokens_max": 30,
    "stall_every": 10, "stall_ms": 100.0,
}  # fmt: skip
SECRET = "sk-live-SECRET-do-not-log"
PROMPT = "my private question about PROMPT-TEXT-42"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": PROMPT}],
            "stream": True, "max_tokens": 30, "temperature": 0.5, **extra}  # fmt: skip


async def traced_request(
    side_url: str, telemetry: Telemetry, headers: dict[str, str] | None = None
) -> bytes:
    sent = {"Authorization": f"Bearer {SECRET}", "traceparent": TRACEPARENT,
            "baggage": "tenant=acme", **(headers or {})}  # fmt: skip
    async with (
        aiohttp.ClientSession() as s,
        s.post(side_url + "/v1/chat/completions", json=chat(), headers=sent) as r,
    ):
        assert r.status == 200
        return await r.read()


def flush(side: SidecarHandle) -> None:
    side.sidecar.flush_traces()


def attr(item: Any, key: str) -> Any:
    """An attribute of a span or event (attributes are loosely typed in the SDK)."""
    return (item.attributes or {})[key]


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


async def test_request_span_phases_and_token_events(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter)
    side = await start_sidecar(sim.url, telemetry=telemetry)
    await traced_request(side.url, telemetry)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    flush(side)
    spans = by_name(exporter.get_finished_spans())
    (server,) = spans["chat sim-model"]
    (prefill,) = spans["queue+prefill"]
    (decode,) = spans["decode"]
    # the client's trace continues; phases are children of the request span
    assert server.kind is SpanKind.SERVER
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert server.parent is not None
    assert f"{server.parent.span_id:016x}" == PARENT_ID
    for child in (prefill, decode):
        assert child.parent is not None
        assert child.parent.span_id == server.context.span_id
        assert child.context.trace_id == server.context.trace_id
    # the engine saw the sidecar's span as its parent, and the baggage
    seen = sim.engine.counters.last_headers
    assert seen["traceparent"] == f"00-{TRACE_ID}-{server.context.span_id:016x}-01"
    assert seen["baggage"] == "tenant=acme"
    a = server.attributes or {}
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "sim-model"
    assert a["gen_ai.response.model"] == "sim-model"
    assert a["gen_ai.usage.output_tokens"] == 30
    assert a["gen_ai.request.max_tokens"] == 30
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.stream"] is True
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)  # type: ignore[arg-type]
    assert str(a["gen_ai.response.id"]).startswith("chatcmpl-")
    assert a["llmobs.stalls"] == 2  # pauses after steps 10 and 20 of 29
    assert a["llmobs.token_count_source"] == "counted"
    assert a["llmobs.itl.p50"] == pytest.approx(0.02, abs=0.005)
    assert a["llmobs.itl.max"] == pytest.approx(0.12, abs=0.02)
    assert float(a["llmobs.smoothness"]) < 0.9  # type: ignore[arg-type]
    assert a["http.response.status_code"] == 200
    # phases on the schedule: 100 ms prefill, then 29 gaps of 20 ms plus two 100 ms pauses
    assert prefill.start_time is not None and prefill.end_time is not None
    assert decode.start_time is not None and decode.end_time is not None
    assert (prefill.end_time - prefill.start_time) / 1e9 == pytest.approx(0.1, abs=0.02)
    assert (decode.end_time - decode.start_time) / 1e9 == pytest.approx(0.78, abs=0.05)
    events = [e for e in decode.events if e.name == "token"]
    # one event per chunk: 29 tokens after the first (two may share a read on a busy machine)
    assert sum(attr(e, "llmobs.token.count") for e in events) == 29
    assert len(events) >= 25
    stalls = [e for e in events if (e.attributes or {})["llmobs.stall"]]
    assert len(stalls) == 2
    assert all(float((e.attributes or {})["llmobs.token.gap"]) > 0.1 for e in stalls)  # type: ignore[arg-type]
    # and one stall event each, at the same moment, with its cause: the engine's pause (one
    # stream alone, no prefill in the gap)
    causes = [e for e in decode.events if e.name == "llmobs.stall"]
    assert [e.timestamp for e in causes] == [e.timestamp for e in stalls]
    assert [(e.attributes or {})["llmobs.stall.cause"] for e in causes] == ["engine_pause"] * 2
    assert [(e.attributes or {})["llmobs.stall.gap"] for e in causes] == [
        (e.attributes or {})["llmobs.token.gap"] for e in stalls]  # fmt: skip
    assert (decode.attributes or {})["llmobs.token_events.dropped"] == 0
    # nothing sensitive: no credentials, no prompt or completion text
    dump = repr([(s.name, s.attributes, [e.attributes for e in s.events])
                 for s in exporter.get_finished_spans()])  # fmt: skip
    assert SECRET not in dump
    assert "PROMPT-TEXT-42" not in dump
    assert "lorem" not in dump and "ipsum" not in dump


async def test_token_events_are_capped_but_keep_every_stall(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter)
    side = await start_sidecar(sim.url, telemetry=telemetry, token_events=5, token_spans=True)
    await traced_request(side.url, telemetry)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    flush(side)
    spans = by_name(exporter.get_finished_spans())
    (decode,) = spans["decode"]
    flags = [(e.attributes or {})["llmobs.stall"] for e in decode.events if e.name == "token"]
    assert flags.count(True) == 2
    assert len(flags) == 5
    assert 20 <= attr(decode, "llmobs.token_events.dropped") <= 24
    assert (decode.attributes or {})["llmobs.token_events.cap"] == 5
    tokens = spans["token"]  # --token-spans: one child span per kept chunk, under decode
    assert len(tokens) == 5
    assert all(t.parent is not None and t.parent.span_id == decode.context.span_id for t in tokens)


async def test_capture_content_is_opt_in_and_truncated(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**{**SCHEDULE, "stall_every": 0})
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter)
    side = await start_sidecar(sim.url, telemetry=telemetry, capture_content=True)
    raw = await traced_request(side.url, telemetry)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    flush(side)
    (server,) = by_name(exporter.get_finished_spans())["chat sim-model"]
    a = server.attributes or {}
    assert "PROMPT-TEXT-42" in str(a["gen_ai.input.messages"])
    completion = str(a["gen_ai.output.messages"])
    assert (
        completion.split(maxsplit=1)[0].encode() in raw
    )  # the streamed words, as the client got them
    assert SECRET not in repr(a)


async def test_unsampled_requests_export_nothing_but_still_propagate(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**{**SCHEDULE, "stall_every": 0, "output_tokens_max": 3,
                             "output_tokens_min": 3})  # fmt: skip
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter)
    side = await start_sidecar(sim.url, telemetry=telemetry)
    await traced_request(side.url, telemetry, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"})
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    flush(side)
    assert exporter.get_finished_spans() == ()
    assert sim.engine.counters.last_headers["traceparent"].startswith(f"00-{TRACE_ID}-")
    assert sim.engine.counters.last_headers["traceparent"].endswith("-00")


def test_tail_sampling_keeps_every_bad_trace_and_a_share_of_good_ones() -> None:
    """``good_ratio``: a good request's trace is kept when its trace id's low 64 bits fall
    under the ratio (as TraceIdRatioBased draws); a bad one always; one whose client sampled
    its trace always."""
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter)
    assert telemetry.tracer is not None
    tracing = Tracing(telemetry.tracer, good_ratio=0.5)
    meta = RequestMeta("POST", "/v1/chat/completions", {}, 0)
    record = RequestStats(
        "chat", "m", Outcome.OK, 200, True, 1.0, 0.1, 0.01, 5, 10, TokenSource.USAGE, 10,
        9.0, 0.09, 0.001, 0.02, 0, 1.0,
    )  # fmt: skip
    times = (0, None, None, 1_000_000)
    kept: dict[int, bool] = {}
    for i in range(200):
        trace = tracing.start(OPENAI_CHAT, 0, meta)
        trace_id = trace.span.get_span_context().trace_id
        assert trace.keep == ((trace_id & (2**64 - 1)) < 2**63)
        verdict = GOOD if i % 2 else Verdict(False, (Objective.TTFT,), ("queue",))
        trace.finish(RequestRecord(record, (), verdict, None, "m"), times, None)
        kept[trace_id] = trace.keep or not verdict.good
    tracing.drain()
    telemetry.tracer_provider.force_flush()  # type: ignore[union-attr]
    exported = {s.context.trace_id for s in exporter.get_finished_spans() if s.parent is None}
    assert exported == {t for t, keep in kept.items() if keep}
    assert 100 < len(exported) < 200  # every bad one (100), about half the good ones
    roots = [s for s in exporter.get_finished_spans() if s.parent is None]
    bad = [s for s in roots if attr(s, "llmobs.slo.verdict") == "bad"]
    assert len({s.context.trace_id for s in bad}) == 100
    assert {tuple(attr(s, "llmobs.slo.missed")) for s in bad} == {("ttft",)}
    assert {tuple(attr(s, "llmobs.slo.miss_causes")) for s in bad} == {("queue",)}
    # a trace the client sampled is kept, good or not; at ratio 1 every trace is kept
    parent = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    sampled = Tracing(telemetry.tracer, good_ratio=0.0).start(
        OPENAI_CHAT, 0, meta._replace(headers=parent)
    )
    assert sampled.keep
    assert Tracing(telemetry.tracer).start(OPENAI_CHAT, 0, meta).keep
    assert not Tracing(telemetry.tracer, good_ratio=0.0).start(OPENAI_CHAT, 0, meta).keep
    telemetry.shutdown()
