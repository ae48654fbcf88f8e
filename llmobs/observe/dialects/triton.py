"""Dialect: Triton Inference Server's generate extension, as TensorRT-LLM's models answer it.

``POST /v2/models/{model}[/versions/{n}]/generate_stream`` streams one SSE ``data:`` event per
model response, its output tensors as JSON fields (server ``src/http_server.cc``): the text in
``text_output`` (a delta with TensorRT-LLM's ensemble), ``model_name``, ``model_version``. No
``[DONE]`` and no finish reason: the stream ends when the body does. ``/generate`` answers one
such object. An error is ``{"error": "..."}``: the whole body before inference started, an
event after. The model is named by the path, not the body.

Token counts: TensorRT-LLM's models send ``num_output_tokens`` (the tokens of that response,
so per event in a stream) and ``num_input_tokens`` when the request sets
``return_num_output_tokens`` / ``return_num_input_tokens``; then they are exact, else each
event with text counts as one token.
"""

from __future__ import annotations

from typing import Any

from llmobs.observe.dialects.base import Dialect, as_int


class TritonStream(Dialect):
    """State of one Triton generate response."""

    __slots__ = ()

    def on_object(self, obj: dict[str, Any]) -> int:
        if self.response_model is None:
            model = obj.get("model_name")
            if isinstance(model, str):
                self.response_model = model
        if "error" in obj:
            self.error = True
            self.finish("error")
            return 0
        text = obj.get("text_output")
        self.keep(text)
        inputs = as_int(obj.get("num_input_tokens"))
        if inputs is not None:
            self.input_tokens = inputs
        count = as_int(obj.get("num_output_tokens"))
        if count is not None and count >= 0:  # the engine's own count of this response
            self.per_chunk_usage = True
            self.output_tokens = (self.output_tokens or 0) + count
            return self.output(count)
        return self.output(1) if isinstance(text, str) and text else 0

    def on_body(self, obj: dict[str, Any]) -> None:
        self.on_object(obj)
