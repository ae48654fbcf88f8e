"""Dialect: Ollama's native NDJSON API (``/api/generate``, ``/api/chat``).

One JSON object per line: ``response`` (generate) or ``message.content`` (chat) carries text,
``thinking`` (generate) or ``message.thinking`` (chat) reasoning, ``message.tool_calls`` tool
calls. The last line (``done``) carries the engine's own counts (``eval_count``,
``prompt_eval_count``), which are used as the token counts, its ``done_reason``, and its
durations in nanoseconds: the prompt-eval (prefill) and model load durations are exported as
they are, since only the engine knows them.
"""

from __future__ import annotations

from typing import Any

from llmobs.observe.dialects.base import Dialect, as_int

_NS = 1e-9


class OllamaStream(Dialect):
    """State of one Ollama native response."""

    __slots__ = ()

    def on_object(self, obj: dict[str, Any]) -> int:
        if "error" in obj:
            self.error = True
            self.finish("error")
            return 0
        tokens = 0
        if obj.get("response"):
            self.keep(obj["response"])
            tokens = self.output(1)
        elif obj.get("thinking"):  # /api/generate with "think": reasoning at the top level
            self.keep(obj["thinking"])
            tokens = self.output(1, reasoning=True)
        message = obj.get("message")
        if isinstance(message, dict) and not tokens:
            if message.get("content") or message.get("tool_calls"):
                self.keep(message.get("content"))
                tokens = self.output(1)
            elif message.get("thinking"):
                self.keep(message["thinking"])
                tokens = self.output(1, reasoning=True)
        if obj.get("done") is True:
            self._final(obj)
        return tokens

    def _final(self, obj: dict[str, Any]) -> None:
        self.done = True
        if isinstance(obj.get("model"), str):
            self.response_model = obj["model"]
        self.finish(obj.get("done_reason") or "stop")
        self.output_tokens = as_int(obj.get("eval_count"))
        self.input_tokens = as_int(obj.get("prompt_eval_count"))
        prompt_eval = as_int(obj.get("prompt_eval_duration"))
        load = as_int(obj.get("load_duration"))
        self.engine_prompt_eval_s = prompt_eval * _NS if prompt_eval is not None else None
        self.engine_load_s = load * _NS if load is not None else None
