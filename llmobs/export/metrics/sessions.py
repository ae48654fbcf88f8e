"""WebSocket sessions and realtime turns into their metrics (``catalogue.SESSION_METRICS``).

A consumer of ``observe.realtime``'s records, as ``sink`` is of requests': a turn is counted
when it ends (``turn``), a session when it ends (``session``), its opening and its messages
as they come (``opened``, ``relayed``). Plain OpenTelemetry instruments on the scraped meter:
sessions are few and a turn's deltas are a realtime voice's pace, not the relay's per-chunk
path. Model labels are bounded as the requests' are (``--max-models``), a model taking a slot
only once one of its turns was answered.
"""

from __future__ import annotations

from opentelemetry.metrics import Meter

from llmobs.export.metrics.catalogue import (
    API,
    MODEL,
    OUTCOME,
    REALTIME_DELTA_GAP,
    REALTIME_FIRST_DELTA,
    REALTIME_TURNS,
    SOURCE,
    WS_ACTIVE,
    WS_DURATION,
    WS_MESSAGES,
    WS_SESSIONS,
)
from llmobs.export.metrics.otel import counter_of, histogram_of
from llmobs.observe.labels import BoundedLabel
from llmobs.observe.realtime import SessionRecord, Turn, TurnOutcome

SOURCES = ("client", "engine")  # by FROM_CLIENT, FROM_ENGINE


class SessionMetrics:
    """The session families on ``meter``; ``max_models`` distinct model labels at most."""

    def __init__(self, meter: Meter, max_models: int) -> None:
        self._models = BoundedLabel(max_models)
        self._sessions = counter_of(meter, WS_SESSIONS)
        self._active = meter.create_up_down_counter(
            WS_ACTIVE.name, WS_ACTIVE.unit, WS_ACTIVE.description
        )
        self._duration = histogram_of(meter, WS_DURATION)
        self._messages = counter_of(meter, WS_MESSAGES)
        self._first = histogram_of(meter, REALTIME_FIRST_DELTA)
        self._gap = histogram_of(meter, REALTIME_DELTA_GAP)
        self._turns = counter_of(meter, REALTIME_TURNS)

    def opened(self, api: str) -> None:
        """A session began (the engine's 101 went to the client)."""
        self._active.add(1, {API: api})

    def relayed(self, api: str, side: int, count: int) -> None:
        """``count`` messages went on from ``side``."""
        self._messages.add(count, {API: api, SOURCE: SOURCES[side]})

    def turn(self, model: str | None, turn: Turn) -> None:
        """A realtime turn ended: its first delta and gaps, and how it ended."""
        label = self._models.get(model, admit=turn.outcome is TurnOutcome.DONE)
        attributes = {MODEL: label}
        if turn.first_delta_s is not None:
            self._first.record(turn.first_delta_s, attributes)
        gap = self._gap
        for value in turn.gaps_s:
            gap.record(value, attributes)
        self._turns.add(1, {MODEL: label, OUTCOME: turn.outcome.value})

    def session(self, record: SessionRecord) -> None:
        """A session ended."""
        label = self._models.get(record.model, admit=False)
        attributes = {API: record.api, MODEL: label, OUTCOME: record.outcome.value}
        self._active.add(-1, {API: record.api})
        self._sessions.add(1, attributes)
        self._duration.record(record.duration_s, attributes)
