"""OpenAI chat and text completions, as vLLM's OpenAI server writes them.

Shapes follow vLLM, since the proxy must parse real vLLM streams: compact JSON, ``data: ...``
events, the chat role announced in its own chunk just before the first token, ``finish_reason``
on the chunk that carries the last token (vLLM puts it there too), then the optional usage
chunk with empty ``choices`` and ``data: [DONE]``. Every token is one word with a leading
space, so token counts can be checked against ``usage``.

Two vLLM behaviours are opt-in per request, so that plain requests stay byte-identical:
``n > 1`` streams one chunk per choice per engine step, each with its ``index``, and a body
with ``reasoning_effort`` sends the first third of each choice's tokens as
``delta.reasoning_content`` (vLLM's reasoning parser field) and counts them in
``usage.completion_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from llmobs.sim.dialects.base import (
    STAMP_SLOT,
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
    stamp_event,
)
from llmobs.sim.pd import Leg, kv_transfer_params, leg_of
from llmobs.sim.request import SimRequest

MAX_N = 128  # bounds the sequences one request may put in the engine
DONE = b"data: [DONE]\n\n"
_ERROR_KINDS = {400: "invalid_request_error", 500: "internal_server_error"}


def error_body(message: str, status: int) -> str:
    """An OpenAI error document."""
    kind = _ERROR_KINDS.get(status, "service_unavailable")
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})


def usage(
    prompt_tokens: int, completion_tokens: int, reasoning: int | None = None
) -> dict[str, Any]:
    """The OpenAI ``usage`` object; reasoning requests add ``completion_tokens_details``."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


def request_metrics(jobs: Sequence[SimRequest]) -> dict[str, float]:
    """vLLM's per-request ``metrics`` of the first choice, from the schedule's own times: the
    truth the sidecar's TTFT phases are checked against. A decode leg's queue time includes
    its KV transfer, as vLLM's does; ``kv_transfer_ms``, that part, is the sim's alone."""
    job = jobs[0]
    metrics = {
        "queue_time_ms": (job.prefill_started_at - job.submitted_at) * 1000,
        "time_to_first_token_ms": (job.first_token_at - job.prefill_started_at) * 1000,
        "generation_time_ms": (job.last_token_at - job.first_token_at) * 1000,
    }
    if job.decode_leg:
        metrics["kv_transfer_ms"] = job.transfer_s * 1000
    return metrics


def reasoning_tokens(job: SimRequest) -> int:
    """How many of a choice's tokens are reasoning: the first third."""
    return job.completion_tokens // 3


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    if chat:
        return messages_text(body.get("messages"))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    raise BadRequest("'prompt' is required and must be a string or a list of strings")


def _leg(body: dict[str, Any], ctx: Context, stream: bool) -> Leg:
    """What the request's ``kv_transfer_params`` make it here; a prefill leg needs this
    engine's address to answer with."""
    leg = leg_of(body.get("kv_transfer_params"), ctx.pd_role, stream)
    return Leg.LOCAL if leg is Leg.PREFILL and ctx.kv_source is None else leg


class Completion(Exchange):
    """A /v1/chat/completions or /v1/completions request and its answer."""

    def __init__(self, raw: bytes, ctx: Context, chat: bool) -> None:
        body = load_object(raw)
        options = optional_object(body, "stream_options")
        max_tokens = optional_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = optional_int(body, "max_tokens", 1)
        n = optional_int(body, "n", 1) or 1
        if n > MAX_N:
            raise BadRequest(f"'n' must be <= {MAX_N}")
        stream = bool(body.get("stream"))
        plan = Plan(
            prompt_tokens=count_prompt_tokens(_prompt_text(body, chat)),
            max_tokens=max_tokens,
            seed=optional_int(body, "seed"),
            ignore_eos=bool(body.get("ignore_eos")),
            n=n,
            leg=_leg(body, ctx, stream),
        )
        super().__init__(plan, stream)
        # a prefill leg's answer: where the decode engine is to pull the prompt's KV cache
        self._kv_params = (
            kv_transfer_params(ctx.kv_source, plan.prompt_tokens, ctx.request_id)
            if plan.leg is Leg.PREFILL and ctx.kv_source is not None
            else None
        )
        self.chat = chat
        self.include_usage = bool(options.get("include_usage"))
        self.continuous_usage = bool(options.get("continuous_usage_stats"))
        self.reasoning = chat and "reasoning_effort" in body
        self._stamp = ctx.received_ns is not None
        self._metrics = ctx.per_request_metrics
        self._received_ns = ctx.received_ns  # sent once, in the first event
        self._head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{ctx.request_id or secrets.token_hex(16)}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(ctx.wall_clock()),
            "model": model_of(body, ctx.model),
        }

    def _event(
        self,
        choices: list[dict[str, Any]],
        usage_: dict[str, Any] | None,
        stamp: bool = False,
        metrics: dict[str, float] | None = None,
    ) -> bytes:
        chunk: dict[str, Any] = {**self._head, "choices": choices}
        if usage_ is not None:
            chunk["usage"] = usage_
        if metrics is not None:
            chunk["metrics"] = metrics
        if stamp:
            received, self._received_ns = self._received_ns, None
            return stamp_event(dumps(chunk), received)
        return f"data: {dumps(chunk)}\n\n".encode()

    def _running_usage(self, completion_tokens: int) -> dict[str, Any] | None:
        if not self.continuous_usage:
            return None
        return usage(self.plan.prompt_tokens, completion_tokens)

    def _roles(self) -> bytes:
        """The chat chunks announcing the assistant role, one per choice, as vLLM sends them."""
        out = b""
        for index in range(self.plan.n):
            choice = {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            out += self._event([choice], self._running_usage(0))
        return out

    def _text(self, chunk: Chunk) -> str:
        """The chunk's text; with ``--stamp`` it ends in the slot ``stamp_event`` fills."""
        return chunk.text + STAMP_SLOT if self._stamp else chunk.text

    def _delta(self, chunk: Chunk, job: SimRequest) -> dict[str, str]:
        if not self.reasoning:
            return {"content": self._text(chunk)}
        split = max(0, min(len(chunk.tokens), reasoning_tokens(job) - chunk.start))
        delta: dict[str, str] = {}
        if split < len(chunk.tokens):
            delta["content"] = "".join(chunk.tokens[split:])
        if split > 0:
            delta["reasoning_content"] = "".join(chunk.tokens[:split])
        if self._stamp:  # in the last text field present
            key = "content" if "content" in delta else "reasoning_content"
            delta[key] += STAMP_SLOT
        return delta

    def chunk(self, index: int, chunk: Chunk, job: SimRequest) -> bytes:
        roles = self._roles() if self.chat and index == 0 and chunk.start == 0 else b""
        finish_reason = job.finish_reason if chunk.last else None
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            choice["delta"] = self._delta(chunk, job)
        else:
            choice["text"] = self._text(chunk)
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        if finish_reason is not None or not self.chat:
            choice["stop_reason"] = None
        # Stamped (``--stamp``): token events only, so stamps counted = chunks with tokens.
        return roles + self._event([choice], self._running_usage(chunk.end), self._stamp)

    def _usage(self, jobs: Sequence[SimRequest]) -> dict[str, Any]:
        reasoning = sum(reasoning_tokens(j) for j in jobs) if self.reasoning else None
        total = sum(j.completion_tokens for j in jobs)
        return usage(self.plan.prompt_tokens, total, reasoning)

    def tail(self, jobs: Sequence[SimRequest]) -> bytes:
        if self._metrics:  # on the last chunk, with the usage when asked for (as vLLM)
            usage_ = self._usage(jobs) if self.include_usage else None
            return self._event([], usage_, metrics=request_metrics(jobs)) + DONE
        usage_chunk = self._event([], self._usage(jobs)) if self.include_usage else b""
        return usage_chunk + DONE

    def _message(self, job: SimRequest) -> dict[str, Any]:
        if not self.reasoning:
            return {"role": "assistant", "content": "".join(job.tokens)}
        split = reasoning_tokens(job)
        return {
            "role": "assistant",
            "reasoning_content": "".join(job.tokens[:split]),
            "content": "".join(job.tokens[split:]),
        }

    def full(self, jobs: Sequence[SimRequest]) -> str:
        choices: list[dict[str, Any]] = []
        for index, job in enumerate(jobs):
            choice: dict[str, Any] = {"index": index}
            if self.chat:
                choice["message"] = self._message(job)
            else:
                choice["text"] = "".join(job.tokens)
            choice.update(logprobs=None, finish_reason=job.finish_reason, stop_reason=None)
            choices.append(choice)
        return dumps(
            {
                "id": self._head["id"],
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self._head["created"],
                "model": self._head["model"],
                "choices": choices,
                "usage": self._usage(jobs),
                **({"metrics": request_metrics(jobs)} if self._metrics else {}),
                **({"kv_transfer_params": self._kv_params} if self._kv_params else {}),
            }
        )


def _chat(raw: bytes, ctx: Context) -> Exchange:
    return Completion(raw, ctx, chat=True)


def _completions(raw: bytes, ctx: Context) -> Exchange:
    return Completion(raw, ctx, chat=False)


ENDPOINTS = (
    Endpoint("/v1/chat/completions", _chat, error_body),
    Endpoint("/v1/completions", _completions, error_body),
)


def client_request(
    model: str, prompt: str, max_tokens: int, chat: bool
) -> tuple[str, dict[str, Any]]:
    """A streaming chat (or completions) request that asks for usage, as vLLM's clients do."""
    usage = {"include_usage": True}
    if chat:
        messages = [{"role": "user", "content": prompt}]
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
                "stream_options": usage}  # fmt: skip
        return "/v1/chat/completions", body
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": usage}  # fmt: skip
    return "/v1/completions", body


API = Api(ENDPOINTS, client_request)
