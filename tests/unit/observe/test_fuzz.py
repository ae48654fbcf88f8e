"""The parsers under fuzzing (hypothesis): every decoder, every dialect, the request parser and
``--inject-usage``'s rewriting. No exception escapes, any chunking gives the same result, and
per-request memory stays bounded. A fast campaign for CI (a few seconds);
``benchmarks/fuzz.py`` runs the same properties with many more examples
(``LLMOBS_FUZZ_EXAMPLES``)."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from llmobs.observe.dialects import (
    ANTHROPIC,
    OLLAMA_CHAT,
    OPENAI_CHAT,
    RESPONSES,
    TGI_STREAM,
    UNKNOWN,
)
from llmobs.observe.dialects.anthropic import AnthropicStream
from llmobs.observe.dialects.base import (
    CAPTURE_LIMIT,
    FINISH_REASONS,
    MAX_FINISH_REASONS,
    Dialect,
    Passthrough,
)
from llmobs.observe.dialects.ollama import OllamaStream
from llmobs.observe.dialects.openai import OpenAIStream
from llmobs.observe.dialects.request import parse_request
from llmobs.observe.dialects.responses import ResponsesStream
from llmobs.observe.dialects.tgi import TgiStream
from llmobs.observe.framing import NdjsonDecoder, SseDecoder
from llmobs.relay.inject import UsageStripper, inject_usage
from tests.support.strategies import (
    FAST,
    PIECES,
    cut_lists,
    json_objects,
    json_values,
    payloads,
    split_at,
    streams,
)

DIALECTS: tuple[type[Dialect], ...] = (
    OpenAIStream, ResponsesStream, AnthropicStream, TgiStream, OllamaStream, Passthrough,
)  # fmt: skip


def sse_run(chunks: list[bytes], max_line: int) -> tuple[list[Any], int, int]:
    decoder = SseDecoder(max_line)
    events: list[Any] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
        assert sse_buffered(decoder) <= 2 * max_line  # a line and an event, whatever arrives
    events.extend(decoder.flush())
    return events, decoder.malformed, decoder.comments


def sse_buffered(decoder: SseDecoder) -> int:
    """Bytes an SSE decoder holds between reads: the unfinished line and the pending event."""
    return decoder.buffered


def ndjson_run(chunks: list[bytes], max_line: int) -> tuple[list[bytes], int]:
    decoder = NdjsonDecoder(max_line)
    lines: list[bytes] = []
    for chunk in chunks:
        lines.extend(decoder.feed(chunk))
        assert decoder.buffered <= max_line
    lines.extend(decoder.flush())
    return lines, decoder.malformed


@FAST
@given(streams, cut_lists, st.sampled_from([8, 64, 1 << 20]))
def test_sse_decoder_same_events_under_any_chunking(
    data: bytes, cuts: list[int], limit: int
) -> None:
    assert sse_run(split_at(data, cuts), limit) == sse_run([data], limit)


@FAST
@given(streams, st.sampled_from([8, 64, 1 << 20]))
def test_sse_decoder_byte_at_a_time(data: bytes, limit: int) -> None:
    assert sse_run([data[i : i + 1] for i in range(len(data))], limit) == sse_run([data], limit)


@FAST
@given(streams, cut_lists, st.sampled_from([8, 64, 1 << 20]))
def test_ndjson_decoder_same_lines_under_any_chunking(
    data: bytes, cuts: list[int], limit: int
) -> None:
    assert ndjson_run(split_at(data, cuts), limit) == ndjson_run([data], limit)


def test_an_endless_event_does_not_grow_the_decoder() -> None:
    """Data lines with no blank line to end their event: memory stays within max_line."""
    decoder = SseDecoder(max_line=64 * 1024)
    tracemalloc.start()
    try:
        for _ in range(20_000):
            assert decoder.feed(b"data: " + b"z" * 100 + b"\n") == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024**2  # 2 MB of event data went through
    assert decoder.malformed == 1
    assert [e.data for e in decoder.feed(b"\ndata: next\n\n")] == [b"next"]


def check_state(dialect: Dialect) -> None:
    """What a dialect keeps is well-typed and bounded, whatever it was fed."""
    assert all(isinstance(k, int) and 0 <= k < 64 and v >= 0 for k, v in dialect.pending.items())
    assert set(dialect.finish_reasons) <= set(FINISH_REASONS)
    assert len(dialect.finish_reasons) <= MAX_FINISH_REASONS
    for count in (dialect.input_tokens, dialect.output_tokens, dialect.reasoning_tokens,
                  dialect.cached_tokens):  # fmt: skip
        assert count is None or (isinstance(count, int) and not isinstance(count, bool))
    captured = dialect.captured or []
    assert sum(map(len, captured[:-1])) < CAPTURE_LIMIT


def fresh(kind: type[Dialect]) -> Dialect:
    dialect = kind()
    dialect.captured = []  # --capture-content: the keep() paths too
    return dialect


@FAST
@given(st.lists(payloads, max_size=30))
def test_no_exception_escapes_on_data(events: list[bytes]) -> None:
    for kind in DIALECTS:
        dialect = fresh(kind)
        for event in events:
            tokens = dialect.on_data(event)
            assert isinstance(tokens, int)
            assert tokens >= 0
        check_state(dialect)


@FAST
@given(st.lists(json_objects, min_size=1, max_size=4))
def test_no_exception_escapes_on_object_and_on_body(objects: list[dict[str, Any]]) -> None:
    for kind in DIALECTS:
        dialect = fresh(kind)
        for obj in objects:
            assert dialect.on_object(obj) >= 0
            dialect.pending.clear()
        for obj in objects:
            dialect.on_body(obj)
        check_state(dialect)


def test_dialect_state_stays_bounded_over_a_long_stream() -> None:
    events = [
        b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}',
        b'{"type":"message_delta","delta":{"stop_reason":"end_turn"}}',
        b'{"type":"error"}',
        b'{"token":{"text":"a"},"details":{"finish_reason":"length"}}',
        b'{"response":"a","done":true,"done_reason":"stop"}',
        b'{"type":"response.completed","response":{"status":"completed"}}',
    ]
    for kind in DIALECTS:
        dialect = fresh(kind)
        for _ in range(10_000):
            for event in events:
                dialect.on_data(event)
        check_state(dialect)


@FAST
@given(json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=300))
def test_request_parsing_never_raises(body: bytes) -> None:
    for route in (OPENAI_CHAT, RESPONSES, ANTHROPIC, TGI_STREAM, OLLAMA_CHAT, UNKNOWN):
        info = parse_request(body, route, capture=True)
        assert info.model is None or isinstance(info.model, str)
    rewritten = inject_usage(body)
    if rewritten is not None:
        assert json.loads(rewritten)["stream_options"]["include_usage"] is True


USAGE = b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
stripper_streams = st.lists(st.sampled_from([*PIECES, USAGE]) | st.binary(max_size=30), max_size=40)


@FAST
@given(stripper_streams.map(b"".join), cut_lists, st.sampled_from([16, 100, 1 << 16]))
def test_usage_stripper_same_output_under_any_chunking_and_bounded(
    data: bytes, cuts: list[int], max_event: int
) -> None:
    stripper = UsageStripper(max_event)
    out = b""
    for chunk in split_at(data, cuts):
        out += stripper.feed(chunk)
        assert len(stripper._buffer) <= max_event  # holds one short event at most
    out += stripper.flush()
    if stripper.stripped == 0:
        assert out == data  # nothing stripped: verbatim, to the byte
    whole = UsageStripper(max_event)
    assert out == whole.feed(data) + whole.flush()


def test_usage_stripper_passes_a_long_event_on_as_it_comes() -> None:
    stripper = UsageStripper()
    assert stripper.feed(b"data: " + b"x" * 1000) == b""  # short so far: held
    out = stripper.feed(b"x" * (1 << 20))  # too long to be the usage event: released at once
    assert len(out) == 6 + 1000 + (1 << 20)
    assert stripper.feed(b"\n\n" + USAGE) == b"\n\n"  # its end passes; usage stripped again
    assert stripper.stripped == 1
