"""A WebSocket session's export (``export.realtime``, ``metrics.sessions``): its families on
/metrics, model labels bounded as the requests' are, and its span with an event per turn
at the turn's end, continuing the upgrade's trace context."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from llmobs.export.metrics.sessions import SessionMetrics
from llmobs.export.realtime import SessionExport, SessionTracing
from llmobs.export.telemetry import build_telemetry
from llmobs.export.tracing import Tracing
from llmobs.observe.realtime import (
    FROM_CLIENT,
    FROM_ENGINE,
    REALTIME,
    SessionOutcome,
    SessionRecord,
    Turn,
    TurnOutcome,
)

S = 1_000_000_000
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _samples(registry: CollectorRegistry, prefix: str) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (s.name, tuple(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith(prefix) and not s.name.endswith("_created")
    }


def _record(model: str | None, turns: tuple[Turn, ...], outcome: SessionOutcome) -> SessionRecord:
    return SessionRecord(REALTIME, model, outcome, 0, 90 * S, (12, 16), turns, 1000, FROM_CLIENT)


DONE = Turn(0.25, (0.02, 0.04), TurnOutcome.DONE, 1 * S, 2 * S)
CUT = Turn(None, (), TurnOutcome.CUT, 80 * S, 90 * S)


def test_the_session_families() -> None:
    telemetry = build_telemetry(self_metrics=False)
    metrics = SessionMetrics(telemetry.meter, max_models=1)
    export = SessionExport(metrics, None)
    export.opened(REALTIME)
    export.relayed(REALTIME, FROM_CLIENT, 12)
    export.relayed(REALTIME, FROM_ENGINE, 16)
    export.turn("m", DONE)
    export.turn("m", CUT)
    export.finished(_record("m", (DONE, CUT), SessionOutcome.OK), {}, 0)
    export.opened(REALTIME)  # one still open
    seen = _samples(telemetry.registry, "llmobs_")
    model = "gen_ai_request_model=m"
    assert seen["llmobs_websocket_sessions_active", ("api=realtime",)] == 1
    assert seen["llmobs_websocket_sessions_total", ("api=realtime", model, "outcome=ok")] == 1
    assert seen["llmobs_websocket_session_duration_seconds_sum",
                ("api=realtime", model, "outcome=ok")] == 90.0  # fmt: skip
    assert seen["llmobs_websocket_messages_total", ("api=realtime", "source=engine")] == 16
    assert seen["llmobs_realtime_time_to_first_delta_seconds_count", (model,)] == 1  # not CUT's
    assert seen["llmobs_realtime_time_to_first_delta_seconds_sum", (model,)] == 0.25
    assert seen["llmobs_realtime_delta_gap_seconds_count", (model,)] == 2
    assert seen["llmobs_realtime_turns_total", (model, "outcome=cut")] == 1
    assert seen["llmobs_realtime_turns_total", (model, "outcome=done")] == 1


def test_a_model_takes_a_slot_only_once_a_turn_of_it_was_answered() -> None:
    telemetry = build_telemetry(self_metrics=False)
    metrics = SessionMetrics(telemetry.meter, max_models=1)
    metrics.turn("nonsense", Turn(None, (), TurnOutcome.ERROR, 0, 1))
    metrics.turn("real", DONE)
    metrics.turn("another", DONE)  # past --max-models
    turns = {k[1]: v for k, v in _samples(telemetry.registry, "llmobs_realtime_turns").items()}
    assert turns == {
        ("gen_ai_request_model=other", "outcome=error"): 1,
        ("gen_ai_request_model=real", "outcome=done"): 1,
        ("gen_ai_request_model=other", "outcome=done"): 1,
    }


def test_the_sessions_span_and_its_turns() -> None:
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(span_exporter=exporter, self_metrics=False)
    assert telemetry.tracer is not None
    tracing = Tracing(telemetry.tracer)
    export = SessionExport(SessionMetrics(telemetry.meter, 8), SessionTracing(tracing))
    headers = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}
    wall0 = 1_700_000_000 * S
    export.finished(_record("m", (DONE, CUT), SessionOutcome.IDLE_TIMEOUT), headers, wall0)
    tracing.drain()
    telemetry.tracer_provider.force_flush()  # type: ignore[union-attr]
    (span,) = exporter.get_finished_spans()
    assert span.name == "websocket realtime"
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert (span.start_time, span.end_time) == (wall0, wall0 + 90 * S)
    attrs = dict(span.attributes or {})
    assert attrs["llmobs.outcome"] == "idle_timeout"
    assert attrs["llmobs.websocket.messages.client"] == 12
    assert attrs["llmobs.websocket.close_code"] == 1000
    assert attrs["llmobs.websocket.closed_by"] == "client"
    assert attrs["gen_ai.request.model"] == "m"
    assert not span.status.is_ok
    done, cut = span.events
    assert done.timestamp == wall0 + 2 * S
    assert dict(done.attributes or {}) == {
        "llmobs.realtime.turn.outcome": "done", "llmobs.realtime.deltas": 3,
        "llmobs.realtime.time_to_first_delta": 0.25, "llmobs.realtime.delta_gap.max": 0.04,
    }  # fmt: skip
    assert dict(cut.attributes or {}) == {
        "llmobs.realtime.turn.outcome": "cut", "llmobs.realtime.deltas": 0,
    }  # fmt: skip
