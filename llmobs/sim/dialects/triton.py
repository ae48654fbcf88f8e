"""Triton Inference Server's generate extension, as TensorRT-LLM's ensemble answers it.

``/v2/models/{model}[/versions/{version}]/generate_stream`` (SSE) and ``/generate``, as the
server writes them (``src/http_server.cc``): ``data: `` and compact JSON per model response,
its outputs as fields (``text_output``, a delta), ``model_name`` and ``model_version`` from the
path, no ``[DONE]``, no finish reason. Request fields may sit at the top level or in
``parameters``. ``return_num_output_tokens`` / ``return_num_input_tokens`` add TensorRT-LLM's
``num_output_tokens`` (the tokens of that response) and ``num_input_tokens``; ``/generate``
echoes the prompt before the output unless ``exclude_input_in_output`` is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from llmobs.sim.dialects.base import (
    Api,
    BadRequest,
    Chunk,
    Context,
    Endpoint,
    Exchange,
    Plan,
    count_prompt_tokens,
    dumps,
    load_object,
    optional_int,
    optional_object,
)
from llmobs.sim.request import SimRequest


def error_body(message: str, status: int) -> str:
    """Triton's error document."""
    return dumps({"error": message})


class Generate(Exchange):
    """A generate or generate_stream request (the path decides streaming)."""

    def __init__(self, raw: bytes, stream: bool, ctx: Context) -> None:
        body = load_object(raw)
        fields = {**optional_object(body, "parameters"), **body}
        prompt = fields.get("text_input")
        if not isinstance(prompt, str):
            raise BadRequest("'text_input' is required and must be a string")
        self.prompt = prompt
        self.model = ctx.params.get("model", ctx.model)
        self.version = ctx.params.get("version", "1")
        self.counts = fields.get("return_num_output_tokens") is True
        self.input_counts = fields.get("return_num_input_tokens") is True
        self.echo = fields.get("exclude_input_in_output") is not True
        plan = Plan(
            prompt_tokens=count_prompt_tokens(prompt),
            max_tokens=optional_int(fields, "max_tokens", 1),
            seed=optional_int(fields, "seed", 0),
        )
        super().__init__(plan, stream)

    def _response(self, text: str, tokens: int, job: SimRequest) -> dict[str, Any]:
        out: dict[str, Any] = {"model_name": self.model, "model_version": self.version}
        if self.input_counts:
            out["num_input_tokens"] = job.prompt_tokens
        if self.counts:
            out["num_output_tokens"] = tokens
        out["text_output"] = text
        return out

    def chunk(self, index: int, chunk: Chunk, job: SimRequest) -> bytes:
        event = self._response(chunk.text, len(chunk.tokens), job)
        return f"data: {dumps(event)}\n\n".encode()

    def tail(self, jobs: Sequence[SimRequest]) -> bytes:
        return b""  # the stream ends with the body

    def full(self, jobs: Sequence[SimRequest]) -> str:
        job = jobs[0]
        text = "".join(job.tokens)
        return dumps(self._response(self.prompt + text if self.echo else text,
                                    job.completion_tokens, job))  # fmt: skip


def _stream(raw: bytes, ctx: Context) -> Exchange:
    return Generate(raw, True, ctx)


def _generate(raw: bytes, ctx: Context) -> Exchange:
    return Generate(raw, False, ctx)


_MODEL = "/v2/models/{model}"
_VERSION = _MODEL + "/versions/{version:[0-9]+}"
ENDPOINTS = tuple(
    Endpoint(base + suffix, parse, error_body)
    for base in (_MODEL, _VERSION)
    for suffix, parse in (("/generate_stream", _stream), ("/generate", _generate))
)


def client_request(
    model: str, prompt: str, max_tokens: int, chat: bool
) -> tuple[str, dict[str, Any]]:
    """A generate_stream request to TensorRT-LLM's ensemble, which names its model in the path."""
    body = {"text_input": prompt, "max_tokens": max_tokens, "stream": True,
            "return_num_input_tokens": True, "return_num_output_tokens": True}  # fmt: skip
    return f"/v2/models/{quote(model, safe='')}/generate_stream", body


API = Api(ENDPOINTS, client_request)
