"""The errors the sidecar answers itself (a 502 when the engine is gone, a 504, a 413, ...), in
the shape of the API the request spoke, so that each SDK raises its own error type with
llmobs's message rather than showing a dict it cannot read. Pure: a route's dialect name, the
status and the message in, the JSON body out.

- OpenAI (and the Responses API, and any route not recognised): the wire's own shape,
  ``{"error": {"message", "type", "code"}}`` (``wire.request.openai_error_body``: it answers
  requests refused before any route is known too), so ``None`` here;
- Anthropic: ``{"type": "error", "error": {"type", "message"}}``, with its error types;
- Ollama and Triton: ``{"error": "message"}``;
- TGI: ``{"error": "message", "error_type": ...}`` (``validation``, ``overloaded``,
  ``generation``).
"""

from __future__ import annotations

import json

# Anthropic's error types (its API reference, "Errors"); 5xx of the sidecar's are api_error
ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
    429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error",
    529: "overloaded_error",
}  # fmt: skip


def _anthropic(status: int, message: str) -> object:
    kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _tgi(status: int, message: str) -> object:
    kind = "validation" if status < 500 else "overloaded" if status == 503 else "generation"
    return {"error": message, "error_type": kind}


def _plain(status: int, message: str) -> object:
    return {"error": message}


_SHAPES = {"anthropic": _anthropic, "ollama": _plain, "triton": _plain, "tgi": _tgi}


def error_body(dialect: str, status: int, message: str) -> bytes | None:
    """The body of an error the sidecar answers, in ``dialect``'s shape (``Route.name``);
    None: the OpenAI shape, the wire's."""
    shape = _SHAPES.get(dialect)
    return json.dumps(shape(status, message)).encode() if shape is not None else None
