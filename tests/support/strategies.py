"""Hypothesis strategies and settings the property tests share: JSON documents that reach the
dialects' deep branches, SSE-shaped byte streams, cut points, and token streams."""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

MS = 1_000_000  # ns

EXAMPLES = int(os.environ.get("LLMOBS_FUZZ_EXAMPLES", "60"))
FAST = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)

# Keys and values the dialects look for, so that random documents reach their deep branches.
KEYS = ("choices", "delta", "message", "content", "text", "index", "finish_reason", "usage",
        "prompt_tokens", "completion_tokens", "prompt_tokens_details", "cached_tokens",
        "completion_tokens_details", "reasoning_tokens", "reasoning_content", "reasoning",
        "refusal", "tool_calls", "function", "arguments", "error", "id", "model", "type",
        "response", "status", "incomplete_details", "reason", "input_tokens", "output_tokens",
        "input_tokens_details", "output_tokens_details", "thinking", "partial_json",
        "stop_reason", "cache_read_input_tokens", "token", "special", "details",
        "generated_tokens", "prefill", "done", "done_reason", "eval_count",
        "prompt_eval_count", "prompt_eval_duration", "load_duration", "stream",
        "stream_options", "include_usage", "max_tokens", "temperature", "options",
        "parameters", "messages", "prompt", "input")  # fmt: skip
WORDS = ("content_block_delta", "text_delta", "thinking_delta", "input_json_delta",
         "message_start", "message_delta", "message_stop", "error", "response.completed",
         "response.incomplete", "response.failed", "response.created",
         "response.output_text.delta", "response.reasoning_text.delta", "completed",
         "incomplete", "failed", "stop", "length", "tool_calls", "eos_token", "x", "")  # fmt: skip

scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
    | st.sampled_from(WORDS)
)  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=16,
)
json_objects = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), json_values, max_size=5)
payloads = (
    json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=200)
    | st.sampled_from(
        [b"[DONE]", b"", b"{", b"\xff\xfe", b'{"choices":[{"delta":{"content":"\xff"}}]}']
    )
)
PIECES = [b"data: ", b"data:", b"data", b"event: e", b"id: 1", b"retry: 5", b":", b": ping",
          b"\n", b"\r", b"\r\n", b"\n\n", b"\xef\xbb\xbf", b"{}", b"[DONE]", b"x" * 40, b"y",
          b"\x00", b"\xff"]  # fmt: skip
streams = st.lists(st.sampled_from(PIECES) | st.binary(max_size=30), max_size=60).map(b"".join)
cut_lists = st.lists(st.integers(min_value=0, max_value=4000), max_size=25)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


gap_ns = st.one_of(
    st.integers(0, 10**6),  # sub-millisecond bursts, equal timestamps
    st.integers(5 * MS, 60 * MS),  # a decode rhythm
    st.integers(10**8, 10**10),  # stalls
)
chunk_tokens = st.one_of(st.just(1), st.integers(-1, 9), st.integers(0, 10**6))


@st.composite
def token_streams(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int | None, int]:
    """Output chunks (time, tokens) of a request, the engine's total if any, a window size."""
    t = draw(st.integers(0, 10**12))
    chunks = []
    ones = draw(st.booleans())  # one token a chunk (the usual stream), or any counts
    for _ in range(draw(st.integers(0, 80))):
        t += draw(gap_ns)
        tokens = 1 if ones else draw(st.just(1) | st.integers(1, 5) | st.integers(-2, 3))
        chunks.append((t, tokens))
    total = draw(st.none() | st.integers(0, 400))
    return chunks, total, draw(st.sampled_from([4, 16, 31, 32, 33, 65536]))
