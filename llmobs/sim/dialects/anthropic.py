"""Anthropic's Messages API: POST /v1/messages, streamed as named server-sent events.

The documented sequence: ``message_start`` (usage so far: the input and one output token),
``content_block_start``, ``ping``, one ``content_block_delta`` per chunk, then
``content_block_stop``, ``message_delta`` (stop reason and output tokens) and
``message_stop``. The three opening events go out as soon as the request is accepted, before
prefill ends, as the API sends them: the first byte is not the first token, which is what a
proxy timing these streams has to get right.
"""

from __future__ import annotations

import secrets
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
    content_text,
    count_prompt_tokens,
    dumps,
    load_object,
    messages_text,
    model_of,
    optional_int,
    sse,
)
from llmobs.sim.request import SimRequest

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}
# The API writes this one event with a space after the colon; the bytes are kept as sent.
_PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def error_body(message: str, status: int) -> str:
    """Anthropic's error document."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return dumps({"type": "error", "error": {"type": kind, "message": message}})


class Messages(Exchange):
    """A /v1/messages request and its answer."""

    def __init__(self, raw: bytes, ctx: Context) -> None:
        body = load_object(raw)
        if body.get("max_tokens") is None:
            raise BadRequest("max_tokens: Field required")
        max_tokens = optional_int(body, "max_tokens", 1)
        prompt = content_text(body.get("system")) + messages_text(body.get("messages"))
        plan = Plan(prompt_tokens=count_prompt_tokens(prompt), max_tokens=max_tokens)
        super().__init__(plan, bool(body.get("stream")))
        self.id = f"msg_{secrets.token_hex(12)}"
        self.model = model_of(body, ctx.model)

    def _message(
        self, content: list[dict[str, Any]], stop_reason: str | None, output: int
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.model,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": self.plan.prompt_tokens, "output_tokens": output},
        }

    def head(self) -> bytes:
        start = {"type": "message_start", "message": self._message([], None, 1)}
        block = {"type": "text", "text": ""}
        block_start = {"type": "content_block_start", "index": 0, "content_block": block}
        return (
            sse("message_start", dumps(start))
            + sse("content_block_start", dumps(block_start))
            + _PING
        )

    def chunk(self, index: int, chunk: Chunk, job: SimRequest) -> bytes:
        delta = {"type": "text_delta", "text": chunk.text}
        return sse(
            "content_block_delta",
            dumps({"type": "content_block_delta", "index": 0, "delta": delta}),
        )

    def tail(self, jobs: Sequence[SimRequest]) -> bytes:
        job = jobs[0]
        delta = {"stop_reason": _STOP_REASONS[job.finish_reason], "stop_sequence": None}
        message_delta = {
            "type": "message_delta",
            "delta": delta,
            "usage": {"output_tokens": job.completion_tokens},
        }
        return (
            sse("content_block_stop", dumps({"type": "content_block_stop", "index": 0}))
            + sse("message_delta", dumps(message_delta))
            + sse("message_stop", dumps({"type": "message_stop"}))
        )

    def full(self, jobs: Sequence[SimRequest]) -> str:
        job = jobs[0]
        content = [{"type": "text", "text": "".join(job.tokens)}]
        return dumps(
            self._message(content, _STOP_REASONS[job.finish_reason], job.completion_tokens)
        )


ENDPOINTS = (Endpoint("/v1/messages", Messages, error_body),)


def client_request(
    model: str, prompt: str, max_tokens: int, chat: bool
) -> tuple[str, dict[str, Any]]:
    """A streaming Messages API request (it has no plain completions)."""
    messages = [{"role": "user", "content": prompt}]
    body = {"model": model, "max_tokens": max_tokens, "messages": messages, "stream": True}
    return "/v1/messages", body


API = Api(ENDPOINTS, client_request)
