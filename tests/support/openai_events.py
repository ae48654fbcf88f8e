"""OpenAI chat chunk events for the property tests of the shortcuts that skip a JSON parse:
the template fast path (tests/unit/observe/dialects/test_openai.py) and the stream reader's
whole reads (tests/unit/observe/test_reader.py). Mostly the common shape, vLLM's key order,
with drawn departures from it, and streams of mostly plain token events; and the dialect
state both paths must leave alike."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from llmobs.observe.dialects.openai import OpenAIStream
from tests.support.strategies import json_values, payloads

# what a dialect keeps that a shortcut could get wrong
STATE = ("pending", "finish_reasons", "error", "malformed", "done", "response_id",
         "response_model", "input_tokens", "output_tokens", "reasoning_tokens",
         "reasoning_chunks", "cached_tokens", "per_chunk_usage")  # fmt: skip

texts = st.text(max_size=8) | st.sampled_from(
    ['"', '\\', '\\"', '"content":"', '","usage":{"completion_tokens":9},"x":"', "\x00", "\n",
     "\ud7ff", "\U0001f600", "é", "", "index\":1", "\x7f", "null}]}"]
)  # fmt: skip
# printable ASCII but quote and backslash: the content the whole-read path takes
plain_words = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7F, exclude_characters='"\\'),
    min_size=1,
    max_size=6,
)
extra = st.dictionaries(
    st.sampled_from(["system_fingerprint", "usage", "error", "service_tier", "content", "x"]),
    json_values,
    max_size=2,
)
choice_extra = st.dictionaries(
    st.sampled_from(["logprobs", "finish_reason", "stop_reason", "index", "message", "text"]),
    json_values | st.sampled_from([None, 0, 1, "stop"]),
    max_size=2,
)
delta_extra = st.dictionaries(
    st.sampled_from(["role", "reasoning_content", "tool_calls", "refusal", "content"]),
    json_values | st.sampled_from(["assistant", None, ""]),
    max_size=2,
)


def state(dialect: OpenAIStream) -> dict[str, Any]:
    return {name: getattr(dialect, name) for name in STATE}


def dumps(obj: Any, compact: bool, ascii_only: bool) -> bytes:
    separators = (",", ":") if compact else (", ", ": ")
    text = json.dumps(obj, separators=separators, ensure_ascii=ascii_only)
    return text.encode("utf-8", "replace")


@st.composite
def chunk_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly the common shape (vLLM's key order), with drawn departures from it."""
    delta: dict[str, Any] = {"content": draw(texts), **draw(delta_extra)}
    choice: dict[str, Any] = {"index": draw(st.sampled_from([0, 0, 0, 1, 70, -1, None]))}
    choice.update(delta=delta, logprobs=None, finish_reason=None)
    choice.update(draw(choice_extra))
    obj: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                           "created": 1700000000, "model": "m"}  # fmt: skip
    obj["choices"] = draw(st.sampled_from([[choice], [choice], [choice, choice], [], [{}]]))
    obj.update(draw(extra))
    return obj


@st.composite
def events(draw: st.DrawFn) -> list[bytes]:
    """A stream: a template-shaped event first, then a mix of every kind of event."""
    compact = draw(st.booleans())
    ascii_only = draw(st.booleans())
    base = draw(chunk_objects())
    out = [dumps(base, compact, ascii_only)]
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 4))
        if kind == 0:  # the same event with other content
            content = draw(texts)
            obj = json.loads(out[0])
            for choice in obj.get("choices") or []:
                if isinstance(choice, dict) and isinstance(choice.get("delta"), dict):
                    choice["delta"]["content"] = content
            out.append(dumps(obj, compact, ascii_only))
        elif kind == 1:  # the bytes around the content, around arbitrary bytes
            head, sep, _ = out[0].partition(b'"content":"')
            body = draw(st.binary(max_size=12) | st.sampled_from(
                [b"\\ud800", b"\\u00e9", b"\\ud83d\\ude00", b'\\"', b"\\x", b"\xed\xa0\x80",
                 b"\xc3\xa9", b"\xff", b"\x1f", b'a"', b"\\\\", b"\\"]
            ))  # fmt: skip
            tail = out[0].partition(b'"content":"')[2].partition(b'"')[2]
            out.append(head + sep + body + b'"' + tail if sep else body)
        elif kind == 2:
            out.append(dumps(draw(chunk_objects()), compact, ascii_only))
        elif kind == 3:
            out.append(draw(payloads))
        else:
            out.append(out[-1])
    return out


@st.composite
def token_streams(draw: st.DrawFn) -> list[bytes]:
    """``events``, with the first event's bytes around other plain content in between (most
    of a real stream: what the whole-read path takes)."""
    stream = draw(events())
    for sep in (b'"content":"', b'"content": "'):
        head, found, rest = stream[0].partition(sep)
        if found:
            break
    out = []
    for event in stream:
        out.append(event)
        for _ in range(draw(st.integers(0, 4)) if found else 0):
            out.append(head + sep + draw(plain_words).encode() + b'"' + rest.partition(b'"')[2])
    return out
