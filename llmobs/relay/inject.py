"""``--inject-usage``: ask the engine for usage, and hide the answer from the client.

Without usage the sidecar can only count chunks, and a chunk is not a token (speculative
decoding, ``--stream-interval``). With ``--inject-usage`` an OpenAI-dialect streaming request
that did not ask for usage is forwarded with ``stream_options.include_usage = true``, and the
extra final usage event (``"choices": []`` plus ``usage``) is removed from the response before
it reaches the client, which therefore receives exactly the bytes it would have received
without the sidecar. Both halves are pure functions over bytes, tested byte for byte.

Exact for engines that, like vLLM and SGLang, add nothing else to the stream when usage is on.
llama.cpp moves its ``timings`` from a chat stream's finish chunk to the usage event when usage
is on: the stripper holds a finish chunk until the next event, and when that is the usage event
it puts the ``timings`` back where llama.cpp writes them without usage, last in the finish
chunk (checked against a real llama-server, tests/integration). OpenAI's own API also adds
``"usage": null`` to every chunk; the sidecar is not meant for it, and a request that set
``continuous_usage_stats`` is never rewritten.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmobs.observe.dialects.base import loads

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_SEPARATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")
# The usage event is a few hundred bytes: an event longer than this is never it, and is passed
# on as it comes instead of being held until it ends (memory and latency stay bounded).
MAX_EVENT = 64 * 1024


def inject_usage(body: bytes) -> bytes | None:
    """The body asking for usage, or None when it is not a streaming request to rewrite."""
    try:
        obj: Any = loads(body)
    except (ValueError, RecursionError):  # the stdlib's parser: nested past its limit
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
    try:  # a body its parser took but cannot be written again goes on as it came:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        return text.encode()  # nested past the recursion limit, or a lone surrogate
    except (RecursionError, UnicodeEncodeError):
        return None


def _event_object(block: bytes) -> dict[str, Any] | None:
    """The JSON object of an event's first ``data:`` line; None if it has none."""
    for line in block.splitlines():
        if line.startswith(b"data:"):
            try:
                obj: Any = loads(line[5:])
            except ValueError:
                return None
            return obj if isinstance(obj, dict) else None
    return None


def _is_usage_event(block: bytes) -> bool:
    # find, not ``in``: ``bytes in bytes`` first tries the needle as an int (a TypeError)
    if block.find(b'"usage"') < 0 or block.find(b'"choices"') < 0:
        return False
    obj = _event_object(block)
    return obj is not None and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


# A finish reason that is a string, not null: only the finish chunk has one, where every
# token chunk of vLLM, SGLang and llama.cpp has ``"finish_reason":null``
_FINISH = re.compile(rb'"finish_reason"[ \t]*:[ \t]*"')


def _is_finish_event(block: bytes) -> bool:
    """A chunk with a finish reason and no usage, that has no ``timings`` of its own."""
    if _FINISH.search(block) is None or block.find(b'"timings"') >= 0:
        return False
    obj = _event_object(block)
    choices = obj.get("choices") if obj is not None else None
    return (
        obj is not None
        and isinstance(choices, list)
        and "usage" not in obj
        and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)
    )


_TIMINGS = re.compile(rb',"timings":\{[^{}]*\}')


def _with_timings(finish: bytes, usage: bytes) -> bytes:
    """The finish chunk with the usage event's ``timings`` last in it, as llama.cpp writes a
    chat stream's finish chunk when usage is off; unchanged if the usage event has none."""
    found = _TIMINGS.search(usage)
    close = finish.rfind(b"}")
    if found is None or close < 0:
        return finish
    return finish[:close] + found.group() + finish[close:]


class UsageStripper:
    """Passes SSE bytes through, minus the usage event the sidecar asked for.

    Complete events are released at once; only an event still incomplete at the end of a
    read waits for the rest of its bytes (the client could not have used it anyway), unless it
    is longer than ``max_event``: then it is passed on as it comes, up to its end. A finish
    chunk waits for the next event (llama.cpp's ``timings``: see the module's docstring).
    """

    __slots__ = ("_buffer", "_finish", "_max_event", "_passing", "stripped")

    def __init__(self, max_event: int = MAX_EVENT) -> None:
        self._max_event = max_event
        self._buffer = b""
        self._finish = b""  # a finish chunk held until the next event
        self._passing: bytes | None = None  # inside a long event: its last bytes seen
        self.stripped = 0

    def feed(self, chunk: bytes) -> bytes:
        if self._passing is not None:
            return self._pass(chunk)
        data = self._buffer + chunk if self._buffer else chunk
        end = max((i + len(sep) for sep in _SEPARATORS if (i := data.rfind(sep)) >= 0), default=-1)
        if end < 0:
            return self._hold(data)
        head = data[:end]
        if self._finish or head.find(b'"usage"') >= 0 or _FINISH.search(head) is not None:
            head = self._strip(head)
        return head + self._hold(data[end:])

    def _strip(self, head: bytes) -> bytes:
        out: list[bytes] = []
        start = 0
        for match in _BOUNDARY.finditer(head):
            block = head[start : match.end()]
            start = match.end()
            small = len(block) <= self._max_event
            if small and _is_usage_event(block):
                self.stripped += 1
                if self._finish:
                    out.append(_with_timings(self._finish, block))
                    self._finish = b""
                out.append(block[: len(block) - len(block.lstrip(b"\r\n"))])  # stray blank lines
                continue
            if self._finish:
                out.append(self._finish)
                self._finish = b""
            if small and _is_finish_event(block):
                self._finish = block
            else:
                out.append(block)
        rest = head[start:]  # "\n\n\n": the last separator found overlaps a match
        if rest and self._finish:  # bytes after a held chunk: it goes first, in order
            out.append(self._finish)
            self._finish = b""
        out.append(rest)
        return b"".join(out)

    def _hold(self, rest: bytes) -> bytes:
        """Keep an incomplete event for the next read, or pass it on if it is too long."""
        if len(rest) <= self._max_event:
            self._buffer = rest
            return b""
        self._buffer = b""
        self._passing = rest[-3:]  # a separator may begin in it and end in the next read
        held, self._finish = self._finish, b""
        return held + rest

    def _pass(self, chunk: bytes) -> bytes:
        """Pass a long event's bytes on; after its end, strip as usual again."""
        seen = self._passing or b""
        found = _BOUNDARY.search(seen + chunk)
        if found is None:
            self._passing = (seen + chunk)[-3:]
            return chunk
        self._passing = None
        end = found.end() - len(seen)
        return chunk[:end] + self.feed(chunk[end:])

    def flush(self) -> bytes:
        """The rest, verbatim (an unterminated last event is passed on as it came)."""
        rest, self._buffer = self._finish + self._buffer, b""
        self._finish = b""
        return rest
