"""A WebSocket session's export: its metrics (``metrics.sessions``) and its span, one SERVER
span from the 101 to the end with an event per turn.

Written when the session ends, from its record, with explicit timestamps, on the tracing
thread (``tracing.Tracing.defer``), as a request's spans are. The span continues the trace
context of the upgrade request. No message content, ever: the turns' timings only.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.trace import SpanKind, Status, StatusCode

from llmobs.export.metrics.sessions import SessionMetrics
from llmobs.export.tracing import OUTCOME, PROVIDER, REQUEST_MODEL, Tracing
from llmobs.observe.realtime import SessionOutcome, SessionRecord, Turn

SPAN = "websocket"  # the span's name, then the api (realtime, websocket)
API = "llmobs.websocket.api"
CLOSE_CODE = "llmobs.websocket.close_code"
CLOSED_BY = "llmobs.websocket.closed_by"
MESSAGES_CLIENT = "llmobs.websocket.messages.client"
MESSAGES_ENGINE = "llmobs.websocket.messages.engine"
TURNS = "llmobs.realtime.turns"
TURN_EVENT = "llmobs.realtime.turn"
FIRST_DELTA = "llmobs.realtime.time_to_first_delta"
DELTAS = "llmobs.realtime.deltas"
GAP_MAX = "llmobs.realtime.delta_gap.max"
TURN_OUTCOME = "llmobs.realtime.turn.outcome"
_SIDES = ("client", "engine")


class SessionTracing:
    """Writes each finished session's span through ``tracing``."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def write(self, record: SessionRecord, headers: Mapping[str, str], wall0: int) -> None:
        """The session's span; ``headers``: the upgrade request's trace context;
        ``wall0``: the wall clock (ns) at ``record.start_ns``."""
        self.tracing.defer(lambda: self._write(record, headers, wall0))

    def _write(self, record: SessionRecord, headers: Mapping[str, str], wall0: int) -> None:
        tracing = self.tracing

        def wall(t_ns: int) -> int:
            return wall0 + (t_ns - record.start_ns)

        attributes: dict[str, str | int] = {
            API: record.api, OUTCOME: record.outcome.value, PROVIDER: tracing.provider.name,
            MESSAGES_CLIENT: record.messages[0], MESSAGES_ENGINE: record.messages[1],
            TURNS: len(record.turns),
        }  # fmt: skip
        if record.model:
            attributes[REQUEST_MODEL] = record.model
        if record.close_code is not None and record.closed_by is not None:
            attributes[CLOSE_CODE] = record.close_code
            attributes[CLOSED_BY] = _SIDES[record.closed_by]
        span = tracing.tracer.start_span(
            f"{SPAN} {record.api}", context=tracing.extract(headers), kind=SpanKind.SERVER,
            start_time=wall0, attributes=attributes,
        )  # fmt: skip
        for turn in record.turns:
            event: dict[str, str | float | int] = {
                TURN_OUTCOME: turn.outcome.value,
                DELTAS: len(turn.gaps_s) + 1,
            }
            if turn.first_delta_s is None:
                event[DELTAS] = 0
            else:
                event[FIRST_DELTA] = turn.first_delta_s
            if turn.gaps_s:
                event[GAP_MAX] = max(turn.gaps_s)
            span.add_event(TURN_EVENT, event, timestamp=wall(turn.end_ns))
        if record.outcome is not SessionOutcome.OK:
            span.set_status(Status(StatusCode.ERROR, record.outcome.value))
        span.end(end_time=wall(record.end_ns))


class SessionExport:
    """Where the relay tells sessions (``relay.upgrade.SessionSink``): their metrics, and
    their spans when tracing is on."""

    def __init__(self, metrics: SessionMetrics, tracing: SessionTracing | None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    def opened(self, api: str) -> None:
        self.metrics.opened(api)

    def relayed(self, api: str, side: int, count: int) -> None:
        self.metrics.relayed(api, side, count)

    def turn(self, model: str | None, turn: Turn) -> None:
        self.metrics.turn(model, turn)

    def finished(self, record: SessionRecord, headers: Mapping[str, str], wall0: int) -> None:
        self.metrics.session(record)
        if self.tracing is not None:
            self.tracing.write(record, headers, wall0)
