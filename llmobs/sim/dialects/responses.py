"""OpenAI's Responses API: POST /v1/responses, streamed as named events with sequence numbers.

The documented sequence for one text message: ``response.created`` and
``response.in_progress`` (sent at once, before prefill ends), ``response.output_item.added``
and ``response.content_part.added`` with the first token, one ``response.output_text.delta``
per chunk, then the ``.done`` events and ``response.completed``, or ``response.incomplete``
with ``incomplete_details.reason = "max_output_tokens"`` when the cap cut the output. Every
event carries its ``sequence_number``, counted from 0.
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
    model_of,
    optional_int,
    sse,
)
from llmobs.sim.dialects.openai import error_body
from llmobs.sim.request import SimRequest


def _input_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return "".join(content_text(item.get("content")) for item in value)
    raise BadRequest("'input' is required and must be a string or a non-empty list of items")


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The Responses API ``usage`` object."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


class Response(Exchange):
    """A /v1/responses request and its answer: one assistant message of output text."""

    def __init__(self, raw: bytes, ctx: Context) -> None:
        body = load_object(raw)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string")
        self.max_output_tokens = optional_int(body, "max_output_tokens", 1)
        prompt = (instructions or "") + _input_text(body.get("input"))
        plan = Plan(prompt_tokens=count_prompt_tokens(prompt), max_tokens=self.max_output_tokens)
        super().__init__(plan, bool(body.get("stream")))
        self.instructions = instructions
        self.model = model_of(body, ctx.model)
        self.id = f"resp_{secrets.token_hex(24)}"
        self.item_id = f"msg_{secrets.token_hex(24)}"
        self.created_at = int(ctx.wall_clock())
        self._sequence = 0

    def _response(self, job: SimRequest | None) -> dict[str, Any]:
        """The response object: in progress (no job yet), completed or incomplete."""
        status, output, usage_, incomplete = "in_progress", [], None, None
        if job is not None:
            status = "completed" if job.finish_reason == "stop" else "incomplete"
            output = [self._item(job, status)]
            usage_ = usage(self.plan.prompt_tokens, job.completion_tokens)
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage_,
            "metadata": {},
        }

    def _item(self, job: SimRequest | None, status: str) -> dict[str, Any]:
        content = [] if job is None else [_part("".join(job.tokens))]
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return sse(kind, dumps(data))

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def head(self) -> bytes:
        return self._event("response.created", response=self._response(None)) + self._event(
            "response.in_progress", response=self._response(None)
        )

    def chunk(self, index: int, chunk: Chunk, job: SimRequest) -> bytes:
        opening = b""
        if chunk.start == 0:
            item = self._item(None, "in_progress")
            opening = self._event("response.output_item.added", output_index=0, item=item)
            opening += self._event("response.content_part.added", **self._where(), part=_part(""))
        return opening + self._event(
            "response.output_text.delta", **self._where(), delta=chunk.text
        )

    def tail(self, jobs: Sequence[SimRequest]) -> bytes:
        job = jobs[0]
        text = "".join(job.tokens)
        final = self._response(job)
        return (
            self._event("response.output_text.done", **self._where(), text=text)
            + self._event("response.content_part.done", **self._where(), part=_part(text))
            + self._event("response.output_item.done", output_index=0, item=final["output"][0])
            + self._event(f"response.{final['status']}", response=final)
        )

    def full(self, jobs: Sequence[SimRequest]) -> str:
        return dumps(self._response(jobs[0]))


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


ENDPOINTS = (Endpoint("/v1/responses", Response, error_body),)


def client_request(
    model: str, prompt: str, max_tokens: int, chat: bool
) -> tuple[str, dict[str, Any]]:
    """A streaming Responses API request."""
    body = {"model": model, "input": prompt, "max_output_tokens": max_tokens, "stream": True}
    return "/v1/responses", body


API = Api(ENDPOINTS, client_request)
