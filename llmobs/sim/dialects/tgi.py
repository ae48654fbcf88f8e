"""Text Generation Inference's native API: /generate_stream (SSE), /generate and POST /.

As TGI's router writes them: ``data:`` with no space, one token per event whatever the
sim's ``tokens_per_chunk`` (TGI has no stream interval), ``index`` counting from 1, and the
last event carrying ``generated_text`` (and ``details`` when ``parameters.details`` asks for
them). An output that ends by itself ends with the EOS token, a special token of its own step
that counts in ``generated_tokens`` and leaves ``generated_text``, as TGI skips special tokens
when decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
from llmobs.sim.request import EOS_TOKEN, SimRequest, token_id

_FINISH_REASONS = {"stop": "eos_token", "length": "length"}
_ERROR_TYPES = {422: "validation", 503: "overloaded"}


def error_body(message: str, status: int) -> str:
    """TGI's error document: the message and the kind of failure."""
    return dumps({"error": message, "error_type": _ERROR_TYPES.get(status, "generation")})


def token(text: str) -> dict[str, Any]:
    """TGI's token object; the logprob is a made-up but stable function of the id."""
    if text == EOS_TOKEN:
        return {"id": token_id(text), "text": text, "logprob": 0.0, "special": True}
    ident = token_id(text)
    return {
        "id": ident,
        "text": text,
        "logprob": -round(0.05 + (ident % 37) / 40, 4),
        "special": False,
    }


def generated_text(job: SimRequest) -> str:
    """The decoded output, special tokens skipped."""
    return "".join(t for t in job.tokens if t != EOS_TOKEN)


class Generate(Exchange):
    """A /generate or /generate_stream request (the path alone decides streaming)."""

    media_type = "text/event-stream"  # axum's Sse sets no charset
    one_token_per_event = True

    def __init__(self, raw: bytes, stream: bool | None) -> None:
        body = load_object(raw)
        if stream is None:  # the compat route: the body says
            stream = bool(body.get("stream"))
        inputs = body.get("inputs")
        if not isinstance(inputs, str):
            raise BadRequest("'inputs' is required and must be a string")
        parameters = optional_object(body, "parameters")
        self.seed = optional_int(parameters, "seed", 0)
        plan = Plan(
            prompt_tokens=count_prompt_tokens(inputs),
            max_tokens=optional_int(parameters, "max_new_tokens", 1),
            seed=self.seed,
            eos=True,
        )
        super().__init__(plan, stream)
        # /generate_stream reads only ``details``; /generate also ``decoder_input_details``.
        self.details = bool(
            parameters.get("details") or (not stream and parameters.get("decoder_input_details"))
        )

    def _details(self, job: SimRequest) -> dict[str, Any]:
        return {
            "finish_reason": _FINISH_REASONS[job.finish_reason],
            "generated_tokens": job.completion_tokens,
            "seed": self.seed,
        }

    def chunk(self, index: int, chunk: Chunk, job: SimRequest) -> bytes:
        event: dict[str, Any] = {
            "index": chunk.end,
            "token": token(chunk.text),
            "generated_text": generated_text(job) if chunk.last else None,
            "details": None,
        }
        if chunk.last and self.details:
            event["details"] = {**self._details(job), "input_length": job.prompt_tokens}
        return f"data:{dumps(event)}\n\n".encode()

    def tail(self, jobs: Sequence[SimRequest]) -> bytes:
        return b""  # the last token's event closes the stream

    def full(self, jobs: Sequence[SimRequest]) -> str:
        job = jobs[0]
        out: dict[str, Any] = {"generated_text": generated_text(job)}
        if self.details:
            tokens = [token(t) for t in job.tokens]
            out["details"] = {**self._details(job), "prefill": [], "tokens": tokens}
        return dumps(out)


class Compat(Generate):
    """POST /, what huggingface_hub's InferenceClient calls: ``stream`` in the body picks
    /generate_stream or /generate, whose answer comes wrapped in a list."""

    def full(self, jobs: Sequence[SimRequest]) -> str:
        return f"[{super().full(jobs)}]"


def _stream(raw: bytes, ctx: Context) -> Exchange:
    return Generate(raw, stream=True)


def _generate(raw: bytes, ctx: Context) -> Exchange:
    return Generate(raw, stream=False)


def _compat(raw: bytes, ctx: Context) -> Exchange:
    return Compat(raw, stream=None)


ENDPOINTS = (
    Endpoint("/generate_stream", _stream, error_body, bad_request_status=422),
    Endpoint("/generate", _generate, error_body, bad_request_status=422),
    Endpoint("/", _compat, error_body, bad_request_status=422),
)


def client_request(
    model: str, prompt: str, max_tokens: int, chat: bool
) -> tuple[str, dict[str, Any]]:
    """A /generate_stream request (TGI serves one model: the body names none)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens, "details": True}}
    return "/generate_stream", body


API = Api(ENDPOINTS, client_request)
