"""Dialect: Text Generation Inference native API (``/generate_stream``, ``/generate``).

TGI streams exactly one token per event: ``{"token": {"text", "special"}, "generated_text",
"details"}``. Special tokens (the final EOS) are generated but not shown, so they are not
output for timing; the last event's ``details.generated_tokens`` is the engine's own count
(EOS included) and ``details.finish_reason`` (``length``, ``eos_token``, ``stop_sequence``) the
reason. Input tokens are known only when the client asked for ``decoder_input_details``.
TGI's Messages API (``/v1/chat/completions``) is the OpenAI dialect.
"""

from __future__ import annotations

from typing import Any

from llmobs.formats.base import Dialect, as_int


class TgiStream(Dialect):
    """State of one TGI native response."""

    __slots__ = ()

    def on_object(self, obj: dict[str, Any]) -> int:
        if "error" in obj:
            self.error = True
            self.finish("error")
        details = obj.get("details")
        if isinstance(details, dict):
            self._details(details)
        token = obj.get("token")
        if isinstance(token, dict) and token.get("text") and not token.get("special"):
            self.keep(token["text"])
            return self.output(1)
        return 0

    def on_body(self, obj: dict[str, Any]) -> None:
        if "error" in obj:
            self.error = True
        details = obj.get("details")
        if isinstance(details, dict):
            self._details(details)

    def _details(self, details: dict[str, Any]) -> None:
        self.finish(details.get("finish_reason"))
        generated = as_int(details.get("generated_tokens"))
        if generated is not None:
            self.output_tokens = generated
        prefill = details.get("prefill")
        if isinstance(prefill, list) and prefill:
            self.input_tokens = len(prefill)
