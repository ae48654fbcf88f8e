"""What every dialect fills in: token counts per event, usage, finish reasons, errors.

A dialect is a small state machine over the decoded events of one response (SSE ``data`` or
an NDJSON line): ``on_data`` answers how many output tokens the event carried and keeps, as
state, what the end of the request needs. It is pure: no clock, no I/O, no telemetry.

Per-choice accounting (OpenAI ``n > 1``): ``on_data`` returns every output token of the event;
those of a choice other than 0 are also added to ``pending[choice]``, so what ``pending`` does
not hold belongs to choice 0. The stream reader takes them (``take_pending``) after each
network read and the request clock times each choice separately; for the usual single
choice, ``pending`` stays empty and costs nothing per event. Dialects without parallel
choices always use choice 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from llmobs.observe.labels import OTHER

# The closed set of finish reasons used as a metric label (each dialect maps onto it).
STOP = "stop"
LENGTH = "length"
TOOL_CALLS = "tool_calls"
CONTENT_FILTER = "content_filter"
ERROR = "error"
ABORTED = "aborted"  # the client went away before the end
NONE = "none"  # the response named no reason (cut short, or a format without one)
# A model name longer than this is cut: it names spans and is a span attribute, and a client
# could send megabytes of it (an OTLP batch over gRPC's 4 MiB would then be dropped whole).
MAX_MODEL_LENGTH = 256
CAPTURE_LIMIT = 4096  # characters of output text kept per request with --capture-content
MAX_FINISH_REASONS = 128  # one per choice (OpenAI allows n <= 128); more is a broken stream
FINISH_REASONS = (STOP, LENGTH, TOOL_CALLS, CONTENT_FILTER, ERROR, ABORTED, OTHER, NONE)

_FINISH_MAP = {
    # OpenAI chat/completions, vLLM, SGLang, llama.cpp, Ollama done_reason
    "stop": STOP,
    "length": LENGTH,
    "tool_calls": TOOL_CALLS,
    "function_call": TOOL_CALLS,
    "content_filter": CONTENT_FILTER,
    "abort": ABORTED,
    "error": ERROR,
    # Anthropic stop_reason
    "end_turn": STOP,
    "stop_sequence": STOP,
    "max_tokens": LENGTH,
    "tool_use": TOOL_CALLS,
    "refusal": CONTENT_FILTER,
    "pause_turn": OTHER,
    # TGI finish_reason
    "eos_token": STOP,
    # TensorRT-LLM's gRPC Generate
    "stop_word": STOP,
    # Responses API incomplete_details.reason
    "max_output_tokens": LENGTH,
}


def normalize_finish(raw: str) -> str:
    """Map an engine's finish reason onto the bounded label set."""
    return _FINISH_MAP.get(raw, OTHER)


def _json_parser() -> tuple[str, Callable[[bytes], Any]]:
    """orjson (installed with llmobs where it has wheels) parses a chunk several times faster
    than json; its name, for ``llmobs_build_info``."""
    try:
        import orjson  # noqa: PLC0415 - optional dependency
    except ImportError:  # pragma: no cover - depends on the environment
        return "json", json.loads
    parse: Callable[[bytes], Any] = orjson.loads
    return "orjson", parse


JSON_PARSER, loads = _json_parser()


def as_int(value: Any) -> int | None:
    """``value`` if it is an int (not a bool), else None: usage fields come from the wire."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Dialect:
    """State of one response in some wire format; subclasses implement ``on_object``."""

    __slots__ = (
        "_captured_chars",
        "cached_tokens",
        "captured",
        "done",
        "engine_load_s",
        "engine_prompt_eval_s",
        "engine_queue_s",
        "error",
        "finish_reasons",
        "input_tokens",
        "kv_transfer",
        "malformed",
        "output_tokens",
        "pending",
        "per_chunk_usage",
        "reasoning_chunks",
        "reasoning_tokens",
        "response_id",
        "response_model",
    )

    def __init__(self) -> None:
        self.done = False
        self.error = False
        self.malformed = 0
        self.per_chunk_usage = False  # output_tokens per event are exact, not assumed
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None  # the engine's own total, when it says
        self.reasoning_tokens: int | None = None  # the engine's own count, when it says
        self.reasoning_chunks = 0  # events that carried reasoning text
        self.cached_tokens: int | None = None
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] = []  # normalized, in the order seen
        self.engine_prompt_eval_s: float | None = None
        self.engine_load_s: float | None = None
        self.engine_queue_s: float | None = None  # the engine's queue, as it reports it (vLLM)
        self.pending: dict[int, int] = {}  # output tokens per choice > 0 since the last drain
        self.captured: list[str] | None = None  # output text, only with --capture-content
        self._captured_chars = 0
        # a whole answer carried ``kv_transfer_params``: a prefill leg's engine did P/D
        self.kv_transfer = False

    def on_data(self, data: bytes) -> int:
        """Read one event's payload; return the number of output tokens it carried."""
        try:
            obj = loads(data)
        except ValueError:  # orjson.JSONDecodeError and UnicodeDecodeError are ValueErrors
            self.malformed += 1
            return 0
        if not isinstance(obj, dict):
            self.malformed += 1
            return 0
        return self.on_object(obj)

    def on_object(self, obj: dict[str, Any]) -> int:
        """Read one decoded event; return its output tokens."""
        raise NotImplementedError

    def on_body(self, obj: dict[str, Any]) -> None:
        """Read the whole body of a non-streaming response (usage, finish reason)."""
        self.kv_transfer = isinstance(obj.get("kv_transfer_params"), dict)
        self.on_object(obj)

    def output(self, tokens: int, choice: int = 0, reasoning: bool = False) -> int:
        """Account ``tokens`` of output to ``choice``; returns ``tokens``, which ``on_data``
        returns (choice 0's share is what ``pending`` does not hold)."""
        if tokens > 0:
            if choice:
                self.pending[choice] = self.pending.get(choice, 0) + tokens
            if reasoning:
                self.reasoning_chunks += 1
        return tokens

    def take_pending(self) -> dict[int, int]:
        """The output tokens of choices other than 0 since the last call; forgotten here."""
        pending = self.pending
        self.pending = {}
        return pending

    def keep(self, text: Any) -> None:
        """Keep output text for a span (``--capture-content`` only), up to a bound."""
        captured = self.captured
        if captured is not None and isinstance(text, str) and self._captured_chars < CAPTURE_LIMIT:
            captured.append(text)
            self._captured_chars += len(text)

    def finish(self, raw: Any) -> None:
        if isinstance(raw, str) and raw and len(self.finish_reasons) < MAX_FINISH_REASONS:
            self.finish_reasons.append(normalize_finish(raw))

    @property
    def finish_reason(self) -> str:
        """The request's label: the reason of the choice that finished first, or ``none``."""
        return self.finish_reasons[0] if self.finish_reasons else NONE


class Passthrough(Dialect):
    """Unknown formats: relayed untouched, nothing counted."""

    __slots__ = ()

    def on_data(self, data: bytes) -> int:
        return 0

    def on_object(self, obj: dict[str, Any]) -> int:
        return 0
