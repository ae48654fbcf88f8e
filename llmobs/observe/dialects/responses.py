"""Dialect: the OpenAI Responses API stream (``/v1/responses``).

Typed events, each naming itself in ``type``: text arrives in ``response.output_text.delta``,
reasoning in ``response.reasoning_text.delta`` / ``response.reasoning_summary_text.delta``,
tool arguments in ``response.function_call_arguments.delta``, refusals in
``response.refusal.delta``. The final ``response.completed`` (or ``response.incomplete`` /
``response.failed``) carries the response object with ``usage`` and ``status``; an ``error``
event is an engine error. One output item at a time: everything is choice 0.
"""

from __future__ import annotations

from typing import Any

from llmobs.observe.dialects.base import Dialect, as_int

_TEXT = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)
_REASONING = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesStream(Dialect):
    """State of one Responses API response."""

    __slots__ = ()

    def on_object(self, obj: dict[str, Any]) -> int:
        kind = obj.get("type")
        if not isinstance(kind, str):
            return 0  # not a typed event (a list here would not even hash)
        if kind in _TEXT or kind in _REASONING:
            delta = obj.get("delta")
            if not delta:
                return 0
            self.keep(delta)
            return self.output(1, reasoning=kind in _REASONING)
        if kind in _FINAL or kind == "response.created":
            response = obj.get("response")
            if isinstance(response, dict):
                self._response(response)
            if kind == "response.failed":
                self.error = True
            return 0
        if kind == "error":
            self.error = True
            self.finish("error")
        return 0

    def on_body(self, obj: dict[str, Any]) -> None:
        self._response(obj)

    def _response(self, response: dict[str, Any]) -> None:
        if isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if isinstance(response.get("model"), str):
            self.response_model = response["model"]
        status = response.get("status")
        if status == "completed":
            self.finish("stop")
        elif status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self.finish(reason if isinstance(reason, str) else "length")
        elif status == "failed":
            self.error = True
            self.finish("error")
        usage = response.get("usage")
        if not isinstance(usage, dict):
            return
        self.input_tokens = as_int(usage.get("input_tokens"))
        self.output_tokens = as_int(usage.get("output_tokens"))
        details = usage.get("input_tokens_details")
        if isinstance(details, dict):
            self.cached_tokens = as_int(details.get("cached_tokens"))
        details = usage.get("output_tokens_details")
        if isinstance(details, dict):
            self.reasoning_tokens = as_int(details.get("reasoning_tokens"))
