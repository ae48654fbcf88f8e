"""``--inject-usage``: ask the engine for usage, and hide the answer from the client.

Without usage the sidecar can only count chunks, and a chunk is not a token (speculative
decoding, ``--stream-interval``). With ``--inject-usage`` an OpenAI-dialect streaming request
that did not ask for usage is forwarded with ``stream_options.include_usage = true``, and the
extra final usage event (``"choices": []`` plus ``usage``) is removed from the response before
it reaches the client, which therefore receives exactly the bytes it would have received
without the sidecar. Both halves are pure functions over bytes, tested byte for byte.

Exact for engines that, like vLLM, SGLang and llama.cpp, add nothing else to the stream when
usage is on. OpenAI's own API also adds ``"usage": null`` to every chunk; the sidecar is not
meant for it, and a request that set ``continuous_usage_stats`` is never rewritten.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmobs.formats.base import loads

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_SEPARATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")


def inject_usage(body: bytes) -> bytes | None:
    """The body asking for usage, or None when it is not a streaming request to rewrite."""
    try:
        obj: Any = loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("stream") is not True:
        return None
    options = obj.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or "include_usage" in options:
        return None
    if "continuous_usage_stats" in options:
        return None
    obj["stream_options"] = {**options, "include_usage": True}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _is_usage_event(block: bytes) -> bool:
    if b'"usage"' not in block or b'"choices"' not in block:
        return False
    for line in block.splitlines():
        if line.startswith(b"data:"):
            try:
                obj: Any = loads(line[5:])
            except ValueError:
                return False
            return (
                isinstance(obj, dict)
                and obj.get("choices") == []
                and isinstance(obj.get("usage"), dict)
            )
    return False


class UsageStripper:
    """Passes SSE bytes through, minus the usage event the sidecar asked for.

    Complete events are released at once; only an event still incomplete at the end of a
    read waits for the rest of its bytes (the client could not have used it anyway).
    """

    __slots__ = ("_buffer", "stripped")

    def __init__(self) -> None:
        self._buffer = b""
        self.stripped = 0

    def feed(self, chunk: bytes) -> bytes:
        data = self._buffer + chunk if self._buffer else chunk
        end = max((i + len(sep) for sep in _SEPARATORS if (i := data.rfind(sep)) >= 0), default=-1)
        if end < 0:
            self._buffer = data
            return b""
        self._buffer = data[end:]
        head = data[:end]
        if b'"usage"' not in head:
            return head
        out: list[bytes] = []
        start = 0
        for match in _BOUNDARY.finditer(head):
            block = head[start : match.end()]
            start = match.end()
            if _is_usage_event(block):
                self.stripped += 1
            else:
                out.append(block)
        return b"".join(out)

    def flush(self) -> bytes:
        """The rest, verbatim (an unterminated last event is passed on as it came)."""
        rest, self._buffer = self._buffer, b""
        return rest
