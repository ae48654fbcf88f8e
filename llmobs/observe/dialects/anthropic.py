"""Dialect: Anthropic-compatible Messages streaming (``/v1/messages``).

vLLM and several gateways serve it. Output arrives in ``content_block_delta`` events:
``text_delta`` (text), ``input_json_delta`` (tool arguments), ``thinking_delta`` (reasoning);
``signature_delta`` is not output. ``message_start`` carries the input usage (and cache reads),
``message_delta`` the stop reason and the cumulative output tokens, ``error`` an engine error.
The output count in ``message_start`` is a placeholder (1 from Anthropic, 0 from vLLM), not a
total: a stream cut before ``message_delta`` is counted by its chunks.
"""

from __future__ import annotations

from typing import Any

from llmobs.observe.dialects.base import Dialect, as_int

_TEXT_FIELDS = {"text_delta": "text", "input_json_delta": "partial_json"}


class AnthropicStream(Dialect):
    """State of one Messages API response."""

    __slots__ = ()

    def on_object(self, obj: dict[str, Any]) -> int:
        kind = obj.get("type")
        if kind == "content_block_delta":  # the usual event: a token
            return self._delta(obj.get("delta"))
        self._event(kind, obj)
        return 0

    def _delta(self, delta: Any) -> int:
        """A content block's delta: a token of text, of a tool call's input, or of thinking."""
        if not isinstance(delta, dict):
            return 0
        dtype = delta.get("type")
        if dtype == "thinking_delta":
            self.keep(delta.get("thinking"))
            return self.output(1, reasoning=True) if delta.get("thinking") else 0
        field = _TEXT_FIELDS.get(dtype) if isinstance(dtype, str) else None
        if field and delta.get(field):
            self.keep(delta[field])
            return self.output(1)
        return 0

    def _event(self, kind: Any, obj: dict[str, Any]) -> None:
        """Any other event: the message's start (its id, model, input usage), its end (stop
        reason, output usage), an error."""
        if kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._message(message, final=False)
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                self.finish(delta.get("stop_reason"))
            self._usage(obj.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.error = True
            self.finish("error")

    def on_body(self, obj: dict[str, Any]) -> None:
        if obj.get("type") == "error":
            self.error = True
            return
        self._message(obj, final=True)
        self.finish(obj.get("stop_reason"))

    def _message(self, message: dict[str, Any], final: bool) -> None:
        if isinstance(message.get("id"), str):
            self.response_id = message["id"]
        if isinstance(message.get("model"), str):
            self.response_model = message["model"]
        self._usage(message.get("usage"), final)

    def _usage(self, usage: Any, final: bool = True) -> None:
        if not isinstance(usage, dict):
            return
        if as_int(usage.get("input_tokens")) is not None:
            self.input_tokens = usage["input_tokens"]
        if as_int(usage.get("cache_read_input_tokens")) is not None:
            self.cached_tokens = usage["cache_read_input_tokens"]
        if final and as_int(usage.get("output_tokens")) is not None:
            self.output_tokens = usage["output_tokens"]
