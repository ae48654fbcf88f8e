"""Dialect: Text Generation Inference native API (``/generate_stream``, ``/generate``).

TGI streams exactly one token per event: ``{"token": {"text", "special"}, "generated_text",
"details"}``. A special token (the final EOS) is not shown, but it is generated: it took a
decode step, it is in the engine's count, and the stream's end waits for it, so it is output
for timing too (else the count, EOS included, over the timed chunks, EOS excluded, would make
TPOT too small by one step). The last event's ``details.generated_tokens`` is the engine's own
count and ``details.finish_reason`` (``length``, ``eos_token``, ``stop_sequence``) the reason.
Input tokens: a stream's final ``details.input_length``; of /generate, only when the client
asked for ``decoder_input_details`` (the prefill tokens are listed then).
TGI's Messages API (``/v1/chat/completions``) is the OpenAI dialect.
"""

from __future__ import annotations

from typing import Any

from llmobs.observe.dialects.base import Dialect, as_int


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
        if not isinstance(token, dict):
            return 0
        if token.get("special"):
            return self.output(1) if "id" in token or token.get("text") else 0
        if token.get("text"):
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
        # a stream's final details say how long the input was (TGI's StreamDetails,
        # router/src/lib.rs); /generate's list the prefill tokens only when the client asked
        # for decoder_input_details
        length = as_int(details.get("input_length"))
        prefill = details.get("prefill")
        if length is not None:
            self.input_tokens = length
        elif isinstance(prefill, list) and prefill:
            self.input_tokens = len(prefill)
