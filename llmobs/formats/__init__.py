"""Stream formats: framing (bytes -> events) and dialects (events -> tokens), all pure.

``operation_for_path`` and ``detect_stream`` decide, from the request path and the response
content type alone, how a response is read; no configuration is needed.
"""

from __future__ import annotations

from typing import Literal

CHAT = "chat"
TEXT_COMPLETION = "text_completion"
OTHER = "other"
OPERATIONS = (CHAT, TEXT_COMPLETION, OTHER)


def operation_for_path(path: str) -> str:
    """The GenAI operation name (``gen_ai.operation.name``) of an OpenAI-style path."""
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return CHAT
    if path.endswith("/completions"):
        return TEXT_COMPLETION
    return OTHER


def detect_stream(content_type: str) -> Literal["sse", "json", "other"]:
    """How to read a response body, from its Content-Type."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "text/event-stream":
        return "sse"
    if media == "application/json" or media.endswith("+json"):
        return "json"
    return "other"
