"""OpenAI wire format of the sim, pure: parse request bodies, render chunks and responses.

Shapes follow what vLLM's OpenAI server sends, since the proxy must parse real vLLM streams:
compact JSON, ``data: ...`` events, the chat role announced in its own chunk just before the
first token, ``finish_reason`` on the chunk that carries the last token (vLLM puts it there
too), then the optional usage chunk with empty ``choices`` and ``data: [DONE]``. Every token
is one word with a leading space, so token counts can be checked against ``usage``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


class BadRequest(ValueError):
    """The body is not a valid completion request; answered with 400."""


@dataclass(frozen=True)
class CompletionCall:
    """What the sim needs from a /v1/chat/completions or /v1/completions body."""

    chat: bool
    model: str
    prompt_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    max_tokens: int | None
    seed: int | None
    ignore_eos: bool


def dumps(obj: Any) -> str:
    """Compact JSON, as vLLM writes it (and cheaper to send per token)."""
    return json.dumps(obj, separators=(",", ":"))


def count_prompt_tokens(text: str) -> int:
    """About four characters per token, the usual rule of thumb for English BPE."""
    return max(1, math.ceil(len(text) / 4))


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    raise BadRequest("message content must be a string or a list of content parts")


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' is required and must be a non-empty list")
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("each message must be an object")
        return "".join(_content_text(m.get("content")) for m in messages)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    raise BadRequest("'prompt' is required and must be a string or a list of strings")


def _optional_int(body: dict[str, Any], name: str, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer")
    if minimum is not None and value < minimum:
        raise BadRequest(f"'{name}' must be >= {minimum}")
    return value


def parse_call(raw: bytes, chat: bool, default_model: str) -> CompletionCall:
    """Validate a request body; raises ``BadRequest`` with an OpenAI-style message."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object")
    max_tokens = _optional_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens", 1)
    model = body.get("model")
    return CompletionCall(
        chat=chat,
        model=model if isinstance(model, str) and model else default_model,
        prompt_tokens=count_prompt_tokens(_prompt_text(body, chat)),
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
        max_tokens=max_tokens,
        seed=_optional_int(body, "seed"),
        ignore_eos=bool(body.get("ignore_eos")),
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The OpenAI ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, kind: str, code: int) -> str:
    """An OpenAI error document."""
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


class ChunkRenderer:
    """Renders the SSE events of one streamed response as bytes ready to write."""

    def __init__(self, call: CompletionCall, completion_id: str, created: int) -> None:
        self._call = call
        self._head = {
            "id": completion_id,
            "object": "chat.completion.chunk" if call.chat else "text_completion",
            "created": created,
            "model": call.model,
        }

    def _event(self, choices: list[dict[str, Any]], completion_tokens: int | None) -> bytes:
        chunk: dict[str, Any] = {**self._head, "choices": choices}
        if completion_tokens is not None:
            chunk["usage"] = usage(self._call.prompt_tokens, completion_tokens)
        return f"data: {dumps(chunk)}\n\n".encode()

    def role(self) -> bytes:
        """The chat chunk announcing the assistant role, sent with the first token."""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._event([choice], 0 if self._call.continuous_usage else None)

    def content(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        """A chunk carrying ``text``; ``completion_tokens`` counts all tokens sent so far."""
        choice: dict[str, Any] = {"index": 0}
        if self._call.chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        if finish_reason is not None or not self._call.chat:
            choice["stop_reason"] = None
        return self._event([choice], completion_tokens if self._call.continuous_usage else None)

    def usage(self, completion_tokens: int) -> bytes:
        """The final usage chunk (``stream_options.include_usage``), with empty choices."""
        return self._event([], completion_tokens)


DONE = b"data: [DONE]\n\n"


def full_response(
    call: CompletionCall,
    *,
    completion_id: str,
    created: int,
    text: str,
    finish_reason: str,
    completion_tokens: int,
) -> str:
    """The body of a non-streamed response."""
    choice: dict[str, Any] = {"index": 0}
    if call.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
    return dumps(
        {
            "id": completion_id,
            "object": "chat.completion" if call.chat else "text_completion",
            "created": created,
            "model": call.model,
            "choices": [choice],
            "usage": usage(call.prompt_tokens, completion_tokens),
        }
    )
