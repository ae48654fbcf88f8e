"""A WebSocket session as observation sees it: the messages each way and, on a realtime API
(vLLM's ``/v1/realtime``, OpenAI's Realtime events), its turns: from a committed input to
its first delta (the first token's analogue), the gaps between deltas, how each turn ended.

Pure: the relay hands each message over with the time it was read (``message``) and the
session's end (``finish``); a ``SessionRecord`` comes out. Of a message only the event's
``type`` and a model's name are read, never audio or text, and only of text messages no
larger than the relay keeps (``KEEP``): a large one (audio, base64) is counted, not parsed.
"""

from __future__ import annotations

import enum
import json
from typing import NamedTuple

from llmobs.observe.labels import bounded

KEEP = 64 * 1024  # bytes of a message kept to read its type: events are small, audio is not
OP_TEXT, OP_CLOSE = 0x1, 0x8
FROM_CLIENT, FROM_ENGINE = 0, 1
REALTIME, WEBSOCKET = "realtime", "websocket"  # the api label's values
APIS = (REALTIME, WEBSOCKET)

# what starts a turn (the client's), and what the engine answers it with: vLLM's events,
# then OpenAI Realtime's (the GA names and the beta's)
COMMITS = frozenset({"input_audio_buffer.commit", "response.create"})
DELTAS = frozenset({
    "transcription.delta", "response.text.delta", "response.output_text.delta",
    "response.audio.delta", "response.output_audio.delta", "response.audio_transcript.delta",
    "response.output_audio_transcript.delta",
    "conversation.item.input_audio_transcription.delta",
})  # fmt: skip
DONES = frozenset({"transcription.done", "response.done"})
ERROR = "error"
SESSION_EVENTS = frozenset({"session.update", "session.created", "session.updated"})


class TurnOutcome(enum.StrEnum):
    """How a turn ended."""

    DONE = "done"  # the engine's done event
    ERROR = "error"  # the engine's error event
    CUT = "cut"  # the session ended first


class SessionOutcome(enum.StrEnum):
    """How a session ended; exactly one per session."""

    OK = "ok"  # a close frame from either side (the engine's a normal code)
    CLIENT_DISCONNECT = "client_disconnect"  # the client's connection ended without one
    UPSTREAM_ERROR = "upstream_error"  # the engine's ended without one, or closed with an error
    IDLE_TIMEOUT = "idle_timeout"  # nothing either way for --websocket-idle-timeout
    TOO_LARGE = "too_large"  # a message over --websocket-max-message-bytes
    CLIENT_TIMEOUT = "client_timeout"  # the client took nothing for --client-timeout
    SHUTDOWN = "shutdown"  # the sidecar stopped


class Turn(NamedTuple):
    """One committed input and its answer: seconds to its first delta (None: none came),
    the gaps between its deltas, how it ended."""

    first_delta_s: float | None
    gaps_s: tuple[float, ...]
    outcome: TurnOutcome
    start_ns: int
    end_ns: int


class SessionRecord(NamedTuple):
    """A finished session, handed to every consumer (metrics, spans)."""

    api: str  # REALTIME or WEBSOCKET
    model: str | None
    outcome: SessionOutcome
    start_ns: int
    end_ns: int
    messages: tuple[int, int]  # from the client, from the engine
    turns: tuple[Turn, ...]
    close_code: int | None  # the first close frame's code (None: no close frame)
    closed_by: int | None  # FROM_CLIENT or FROM_ENGINE: who sent it

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class Session:
    """One session's observation: ``message`` per message, ``finish`` once. Turns that end
    are handed back as they end (``message``'s result), so a long session's first deltas
    are seen before it closes."""

    __slots__ = ("_first", "_gaps", "_last", "_start", "api", "close", "messages", "model",
                 "start_ns", "turns")  # fmt: skip

    def __init__(self, api: str, start_ns: int, model: str | None = None) -> None:
        self.api = api
        self.start_ns = start_ns
        self.model = model
        self.messages = [0, 0]
        self.turns: list[Turn] = []
        self.close: tuple[int, int] | None = None  # who sent the first close frame, its code
        self._start: int | None = None  # the open turn's commit (None: no turn open)
        self._first: int | None = None  # its first delta
        self._last = 0  # its last delta
        self._gaps: list[float] = []

    def message(self, side: int, t_ns: int, opcode: int, payload: bytes | None) -> Turn | None:
        """A message from ``side`` read at ``t_ns``; the turn it ended, if it ended one."""
        self.messages[side] += 1
        if opcode == OP_CLOSE:
            if self.close is None:
                self.close = (side, _close_code(payload))
            return None
        if opcode != OP_TEXT or payload is None or self.api != REALTIME:
            return None
        kind, model = _event(payload)
        if kind in SESSION_EVENTS:
            self.model = model or self.model
        elif side == FROM_CLIENT:
            if kind in COMMITS and self._start is None:
                self._start = t_ns
        elif kind in DELTAS:
            self._delta(t_ns)
        elif kind in DONES:
            return self._end_turn(t_ns, TurnOutcome.DONE)
        elif kind == ERROR:
            return self._end_turn(t_ns, TurnOutcome.ERROR)
        return None

    def _delta(self, t_ns: int) -> None:
        if self._start is None:
            self._start = t_ns  # deltas with no commit seen (server-side VAD): a turn begins
        if self._first is None:
            self._first = t_ns
        else:
            self._gaps.append((t_ns - self._last) / 1e9)
        self._last = t_ns

    def _end_turn(self, t_ns: int, outcome: TurnOutcome) -> Turn | None:
        start = self._start
        if start is None:
            return None  # an error outside a turn: the session's, not a turn's
        first = None if self._first is None else (self._first - start) / 1e9
        turn = Turn(first, tuple(self._gaps), outcome, start, t_ns)
        self.turns.append(turn)
        self._start = self._first = None
        self._gaps = []
        return turn

    def finish(self, t_ns: int, outcome: SessionOutcome) -> tuple[SessionRecord, Turn | None]:
        """The session ended: its record, and the turn it cut short (if one was open)."""
        cut = self._end_turn(t_ns, TurnOutcome.CUT)
        side, code = self.close if self.close is not None else (None, None)
        record = SessionRecord(
            self.api, self.model, outcome, self.start_ns, t_ns, (self.messages[0],
            self.messages[1]), tuple(self.turns), code, side,
        )  # fmt: skip
        return record, cut


def closed_outcome(engine_ended: bool, close: tuple[int, int] | None) -> SessionOutcome:
    """How a session whose connection ended (the engine's when ``engine_ended``) ended: a
    close frame seen first is a clean end unless the engine's code is an error."""
    if close is None:
        return SessionOutcome.UPSTREAM_ERROR if engine_ended else SessionOutcome.CLIENT_DISCONNECT
    side, code = close
    if side == FROM_ENGINE and code not in (1000, 1001, 1005):
        return SessionOutcome.UPSTREAM_ERROR
    return SessionOutcome.OK


def api_of(path: str) -> str:
    """The api label of a WebSocket's path: ``realtime`` for a realtime route."""
    return REALTIME if path.rstrip("/").endswith("/realtime") else WEBSOCKET


def _event(payload: bytes) -> tuple[str, str | None]:
    """A JSON event's type and the model it names (vLLM's ``model``, OpenAI's
    ``session.model``); ("", None) for anything else."""
    try:
        event = json.loads(payload)
    except ValueError:
        return "", None
    if not isinstance(event, dict):
        return "", None
    kind = event.get("type")
    model = event.get("model")
    session = event.get("session")
    if model is None and isinstance(session, dict):
        model = session.get("model")
    return (
        kind if isinstance(kind, str) else "",
        bounded(model) if isinstance(model, str) and model else None,
    )


def _close_code(payload: bytes | None) -> int:
    if payload is None or len(payload) < 2:
        return 1005
    return int.from_bytes(payload[:2], "big")
