"""Dialect: OpenAI-compatible chat and completions streams -> output-token counts.

Pure: it takes the ``data`` of each SSE event and answers how many output tokens that event
carried, keeping what the end of the request needs (usage, model, finish reasons) as state.
vLLM, SGLang, TGI's Messages API, llama.cpp and Ollama's /v1 all speak this dialect.

What counts as output: generated text in ``delta.content``, ``delta.reasoning_content`` /
``delta.reasoning``, ``delta.refusal``, tool-call argument deltas, or a completions
``text``. Role-only, empty and finish-only chunks are not output. Tokens per chunk: when the
engine reports cumulative usage on every chunk (vLLM's ``continuous_usage_stats``) the delta of
``completion_tokens`` is exact; otherwise a chunk counts as one token, and the final ``usage``
(``include_usage``) lets the timer spread the true total over the chunks afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def _json_parser() -> Callable[[bytes], Any]:
    """orjson (the ``fast`` extra) parses a chunk several times faster than json."""
    try:
        import orjson  # noqa: PLC0415 - optional dependency
    except ImportError:  # pragma: no cover - depends on the environment
        return json.loads
    parse: Callable[[bytes], Any] = orjson.loads
    return parse


loads = _json_parser()

DONE = b"[DONE]"


def _has_text(delta: dict[str, Any]) -> bool:
    if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
        return True
    if delta.get("refusal"):
        return True
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                fn = call.get("function")
                if isinstance(fn, dict) and fn.get("arguments"):
                    return True
    return False


class OpenAIStream:
    """State of one OpenAI-dialect stream; ``on_data`` returns output tokens per event."""

    __slots__ = (
        "_cumulative",
        "_usage_chunks",
        "done",
        "error",
        "finish_reasons",
        "input_tokens",
        "malformed",
        "output_tokens",
        "per_chunk_usage",
        "response_id",
        "response_model",
    )

    def __init__(self) -> None:
        self.done = False
        self.error = False
        self.malformed = 0
        self.per_chunk_usage = False
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] = []
        self._cumulative = 0  # completion tokens already attributed to chunks
        self._usage_chunks = 0  # chunks seen with both choices and usage

    def on_data(self, data: bytes) -> int:
        """Read one event's data; return the number of output tokens it carried."""
        if data == DONE:
            self.done = True
            return 0
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
        """Read one decoded chunk (also the whole body of a non-streaming response)."""
        if self.response_id is None:
            rid = obj.get("id")
            if isinstance(rid, str):
                self.response_id = rid
            model = obj.get("model")
            if isinstance(model, str):
                self.response_model = model
        if "error" in obj:
            self.error = True
        output = False
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or choice.get("message")
                if isinstance(delta, dict):
                    output = output or _has_text(delta)
                elif choice.get("text"):
                    output = True
                reason = choice.get("finish_reason")
                if isinstance(reason, str):
                    self.finish_reasons.append(reason)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            prompt = usage.get("prompt_tokens")
            completion = usage.get("completion_tokens")
            if isinstance(prompt, int):
                self.input_tokens = prompt
            if isinstance(completion, int):
                self.output_tokens = completion
                if choices:
                    return self._chunk_usage(completion, output)
        return 1 if output else 0

    def _chunk_usage(self, completion: int, output: bool) -> int:
        """Tokens of a chunk that carries both choices and cumulative usage.

        Usage on one such chunk proves nothing: llama.cpp and TGI put the final total on their
        last chunk, next to an empty delta. Only from the second one on is the usage
        continuous (vLLM's ``continuous_usage_stats``) and the per-chunk delta exact. Tokens
        of a chunk without text (an EOS, a role chunk) are carried to the next text chunk.
        """
        self._usage_chunks += 1
        if self._usage_chunks == 1:
            if output:
                self._cumulative = completion
            return 1 if output else 0
        self.per_chunk_usage = True
        if not output:
            return 0
        tokens = completion - self._cumulative
        self._cumulative = completion
        return max(tokens, 1)
