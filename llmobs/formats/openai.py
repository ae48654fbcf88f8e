"""Dialect: OpenAI-compatible Chat Completions and (legacy) Completions streams.

vLLM, SGLang, TGI's Messages API, llama.cpp, Ollama's /v1 and most gateways speak it.

What counts as output: generated text in ``delta.content``, ``delta.reasoning_content`` /
``delta.reasoning`` (reasoning: counted and labelled as such), ``delta.refusal``, tool-call
argument deltas, or a completions ``text``. Role-only, empty and finish-only chunks are not
output; ``logprobs`` ride along and change nothing. Choices (``n > 1``) are accounted
separately by their ``index``.

Tokens per chunk: when the engine reports cumulative usage on every chunk (vLLM's
``continuous_usage_stats``) the delta of ``completion_tokens`` is exact; otherwise a chunk
counts as one token and the final ``usage`` (``include_usage``, the ``choices: []`` chunk)
lets the timer spread the true total afterwards. Usage on a single chunk that also has choices
proves nothing (llama.cpp and TGI put the final total there): only from the second such chunk
on is usage taken as continuous.
"""

from __future__ import annotations

from typing import Any

from llmobs.formats.base import Dialect, as_int, loads

DONE = b"[DONE]"

__all__ = ["DONE", "OpenAIStream", "loads"]


def _text_kind(delta: dict[str, Any]) -> int:
    """0: no output; 1: visible output (content, refusal, tool arguments); 2: reasoning."""
    if delta.get("content") or delta.get("refusal"):
        return 1
    if delta.get("reasoning_content") or delta.get("reasoning"):
        return 2
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                fn = call.get("function")
                if isinstance(fn, dict) and fn.get("arguments"):
                    return 1
    return 0


def _text_of(delta: dict[str, Any]) -> str:
    parts = [delta.get(k) for k in ("reasoning_content", "reasoning", "content", "refusal")]
    return "".join(p for p in parts if isinstance(p, str))


class OpenAIStream(Dialect):
    """State of one OpenAI-dialect response."""

    __slots__ = ("_cumulative", "_usage_chunks")

    def __init__(self) -> None:
        super().__init__()
        self._cumulative = 0  # completion tokens already attributed to chunks
        self._usage_chunks = 0  # chunks seen with both choices and usage

    def on_data(self, data: bytes) -> int:
        if data == DONE:
            self.done = True
            return 0
        try:
            obj = loads(data)
        except ValueError:
            self.malformed += 1
            return 0
        if not isinstance(obj, dict):
            self.malformed += 1
            return 0
        return self.on_object(obj)

    def on_object(self, obj: dict[str, Any]) -> int:
        if self.response_id is None:
            rid = obj.get("id")
            if isinstance(rid, str):
                self.response_id = rid
            model = obj.get("model")
            if isinstance(model, str):
                self.response_model = model
        if "error" in obj:
            self.error = True
        kind, choice = 0, 0
        choices = obj.get("choices")
        if isinstance(choices, list):
            for item in choices:
                if not isinstance(item, dict):
                    continue
                delta = item.get("delta") or item.get("message")
                found = (
                    _text_kind(delta) if isinstance(delta, dict) else (1 if item.get("text") else 0)
                )
                if found and self.captured is not None:
                    self.keep(_text_of(delta) if isinstance(delta, dict) else item.get("text"))
                if found and not kind:
                    kind = found
                    index = item.get("index")
                    choice = index if isinstance(index, int) and 0 <= index < 64 else 0
                reason = item.get("finish_reason")
                if reason:
                    self.finish(reason)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            tokens = self._usage(usage, bool(choices), kind != 0)
            if tokens is not None:
                return self.output(tokens, choice, kind == 2)
        return self.output(1, choice, kind == 2) if kind else 0

    def _usage(self, usage: dict[str, Any], has_choices: bool, output: bool) -> int | None:
        """Record usage; for a chunk with choices and continuous usage, its exact tokens."""
        prompt = as_int(usage.get("prompt_tokens"))
        completion = as_int(usage.get("completion_tokens"))
        if prompt is not None:
            self.input_tokens = prompt
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and as_int(details.get("cached_tokens")) is not None:
            self.cached_tokens = details["cached_tokens"]
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict) and as_int(details.get("reasoning_tokens")) is not None:
            self.reasoning_tokens = details["reasoning_tokens"]
        if completion is None:
            return None
        self.output_tokens = completion
        if not has_choices:
            return None
        self._usage_chunks += 1
        if self._usage_chunks == 1:
            if output:
                self._cumulative = completion
            return None
        self.per_chunk_usage = True
        if not output:
            return 0  # an EOS or role chunk: its tokens are carried to the next text chunk
        tokens = completion - self._cumulative
        self._cumulative = completion
        return max(tokens, 1)
