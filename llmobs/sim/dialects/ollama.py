"""Ollama's native API: /api/generate and /api/chat, streamed as NDJSON.

As Ollama documents it: ``stream`` defaults to true, each line is one JSON object ending in
``\\n``, the last line has ``"done":true``, an empty ``response`` (or message content), the
``done_reason`` and the counters Ollama reports, durations in integer nanoseconds. Those
durations come from the engine's schedule (prefill step, first to last token), so a proxy
that reads them can be checked against the timing it measured itself.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime
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
    messages_text,
    model_of,
    optional_int,
    optional_object,
)
from llmobs.sim.request import SimRequest, token_id

LOAD_DURATION_NS = 5_000_000  # the model is always loaded: a small constant, as when warm
_DONE_REASONS = {"stop": "stop", "length": "length"}


def error_body(message: str, status: int) -> str:
    """Ollama's error document: a bare ``error`` string, whatever the status."""
    return dumps({"error": message})


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def durations(job: SimRequest) -> dict[str, int]:
    """Ollama's timing fields from the schedule: prefill step, then first to last token."""
    prompt_eval = _ns(job.first_token_at - job.prefill_started_at)
    eval_ = _ns(job.last_token_at - job.first_token_at)
    return {
        "total_duration": LOAD_DURATION_NS + prompt_eval + eval_,
        "load_duration": LOAD_DURATION_NS,
        "prompt_eval_count": job.prompt_tokens,
        "prompt_eval_duration": prompt_eval,
        "eval_count": job.completion_tokens,
        "eval_duration": eval_,
    }


class _Ollama(Exchange):
    """The parts /api/generate and /api/chat share: options, timestamps, the final line."""

    media_type = "application/x-ndjson"

    def __init__(self, body: dict[str, Any], ctx: Context, prompt: str) -> None:
        options = optional_object(body, "options")
        num_predict = optional_int(options, "num_predict")
        if num_predict == 0:
            raise BadRequest("'num_predict' must not be 0")
        plan = Plan(
            prompt_tokens=count_prompt_tokens(prompt),
            # Negative means "no limit" in Ollama (-1 infinite, -2 fill the context).
            max_tokens=num_predict if num_predict is not None and num_predict > 0 else None,
            seed=optional_int(options, "seed"),
        )
        super().__init__(plan, bool(body.get("stream", True)))
        self._model = model_of(body, ctx.model)
        self._clock = ctx.wall_clock

    def _created_at(self) -> str:
        # RFC 3339 in UTC, as Go marshals a time.Time (microseconds are enough here).
        moment = datetime.fromtimestamp(self._clock(), UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    @abstractmethod
    def _text_field(self, text: str) -> dict[str, Any]:
        """The field carrying generated text: ``response`` or an assistant ``message``."""

    def _final_extra(self, job: SimRequest) -> dict[str, Any]:
        return {}

    def _object(self, text: str, job: SimRequest | None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self._model, "created_at": self._created_at()}
        out.update(self._text_field(text))
        out["done"] = job is not None
        if job is not None:
            out["done_reason"] = _DONE_REASONS[job.finish_reason]
            out.update(self._final_extra(job))
            out.update(durations(job))
        return out

    def chunk(self, index: int, chunk: Chunk, job: SimRequest) -> bytes:
        return (dumps(self._object(chunk.text, None)) + "\n").encode()

    def tail(self, jobs: Sequence[SimRequest]) -> bytes:
        return (dumps(self._object("", jobs[0])) + "\n").encode()

    def full(self, jobs: Sequence[SimRequest]) -> str:
        return dumps(self._object("".join(jobs[0].tokens), jobs[0]))


class Generate(_Ollama):
    """POST /api/generate: ``response`` text per line; the last line carries ``context``."""

    def __init__(self, raw: bytes, ctx: Context) -> None:
        body = load_object(raw)
        prompt, system = body.get("prompt"), body.get("system") or ""
        if not isinstance(prompt, str) or not isinstance(system, str):
            raise BadRequest("'prompt' is required and must be a string")
        super().__init__(body, ctx, system + prompt)

    def _text_field(self, text: str) -> dict[str, Any]:
        return {"response": text}

    def _final_extra(self, job: SimRequest) -> dict[str, Any]:
        # Ollama's conversation state for the next call; here the ids of what was generated.
        return {"context": [token_id(t) for t in job.tokens]}


class Chat(_Ollama):
    """POST /api/chat: an assistant ``message`` per line."""

    def __init__(self, raw: bytes, ctx: Context) -> None:
        body = load_object(raw)
        super().__init__(body, ctx, messages_text(body.get("messages")))

    def _text_field(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}}


ENDPOINTS = (
    Endpoint("/api/generate", Generate, error_body),
    Endpoint("/api/chat", Chat, error_body),
)


def client_request(
    model: str, prompt: str, max_tokens: int, chat: bool
) -> tuple[str, dict[str, Any]]:
    """A chat (or generate) request: Ollama streams unless told not to."""
    options = {"num_predict": max_tokens}
    if chat:
        messages = [{"role": "user", "content": prompt}]
        return "/api/chat", {"model": model, "messages": messages, "options": options}
    return "/api/generate", {"model": model, "prompt": prompt, "options": options}


API = Api(ENDPOINTS, client_request)
