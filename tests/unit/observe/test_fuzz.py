"""The parsers under fuzzing (hypothesis): every decoder, every dialect, the request parser and
``--inject-usage``'s rewriting. No exception escapes, any chunking gives the same result, and
per-request memory stays bounded. The properties are ``tests/support/fuzz.py``'s; here a fast
campaign for CI (a few seconds); ``benchmarks/fuzz.py`` runs this file with many more examples
(``LLMOBS_FUZZ_EXAMPLES``), and atheris on the same properties."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from llmobs.observe.framing import SseDecoder
from llmobs.relay.inject import UsageStripper
from tests.support.fuzz import (
    DIALECTS,
    check_state,
    check_stream,
    dialects_take_any_objects,
    dialects_take_any_payloads,
    fresh,
    ndjson_same_lines,
    requests_parse,
    sse_same_events,
    stripper_same_output,
)
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


@FAST
@given(streams, cut_lists, st.sampled_from([8, 64, 1 << 20]))
def test_sse_decoder_same_events_under_any_chunking(
    data: bytes, cuts: list[int], limit: int
) -> None:
    sse_same_events(data, split_at(data, cuts), limit)


@FAST
@given(streams, st.sampled_from([8, 64, 1 << 20]))
def test_sse_decoder_byte_at_a_time(data: bytes, limit: int) -> None:
    sse_same_events(data, [data[i : i + 1] for i in range(len(data))], limit)


@FAST
@given(streams, cut_lists, st.sampled_from([8, 64, 1 << 20]))
def test_ndjson_decoder_same_lines_under_any_chunking(
    data: bytes, cuts: list[int], limit: int
) -> None:
    ndjson_same_lines(data, split_at(data, cuts), limit)


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


@FAST
@given(st.lists(payloads, max_size=30))
def test_no_exception_escapes_on_data(events: list[bytes]) -> None:
    dialects_take_any_payloads(events)


@FAST
@given(st.lists(json_objects, min_size=1, max_size=4))
def test_no_exception_escapes_on_object_and_on_body(objects: list[dict[str, Any]]) -> None:
    dialects_take_any_objects(objects)


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
    requests_parse(body)


USAGE = b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
stripper_streams = st.lists(st.sampled_from([*PIECES, USAGE]) | st.binary(max_size=30), max_size=40)


@FAST
@given(stripper_streams.map(b"".join), cut_lists, st.sampled_from([16, 100, 1 << 16]))
def test_usage_stripper_same_output_under_any_chunking_and_bounded(
    data: bytes, cuts: list[int], max_event: int
) -> None:
    stripper_same_output(data, split_at(data, cuts), max_event)


def test_usage_stripper_passes_a_long_event_on_as_it_comes() -> None:
    stripper = UsageStripper()
    assert stripper.feed(b"data: " + b"x" * 1000) == b""  # short so far: held
    out = stripper.feed(b"x" * (1 << 20))  # too long to be the usage event: released at once
    assert len(out) == 6 + 1000 + (1 << 20)
    assert stripper.feed(b"\n\n" + USAGE) == b"\n\n"  # its end passes; usage stripped again
    assert stripper.stripped == 1


@FAST
@given(stripper_streams.map(b"".join), cut_lists, st.sampled_from([8, 64, 4096]))
def test_one_stream_through_every_property(data: bytes, cuts: list[int], limit: int) -> None:
    """``check_stream``, what atheris runs (``benchmarks/fuzz.py``), kept working here."""
    check_stream(data, cuts, limit)
