"""SseDecoder: the event-stream rules, and the same events under any chunking; its
``payloads`` fast path (a read of whole events skips the line state machine) held to the
events ``feed`` gives (hypothesis). NDJSON and both decoders under fuzzing: test_fuzz.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmobs.observe.framing import SseDecoder, SseEvent
from tests.support.strategies import FAST, PIECES, cut_lists, split_at

TRANSCRIPT = (
    b": keep-alive\n\n"
    b'data: {"a":1}\n\n'
    b"event: delta\r\n"
    b"id: 7\r\n"
    b"data: line one\r\n"
    b"data: line two\r\n\r\n"
    b"retry: 100\r"
    b"data:no-space\r\r"
    b"data\n\n"
    b'{"raw": "json line, not SSE"}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SseEvent(b'{"a":1}'),
    SseEvent(b"line one\nline two", "delta", "7"),
    SseEvent(b"no-space", "", "7"),
    SseEvent(b"", "", "7"),
    SseEvent(b"[DONE]", "", "7"),
]


def decode(chunks: list[bytes], max_line: int = 1 << 20) -> tuple[list[SseEvent], SseDecoder]:
    decoder = SseDecoder(max_line)
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.flush())
    return events, decoder


def test_whole_transcript_gives_expected_events() -> None:
    events, decoder = decode([TRANSCRIPT])
    assert events == EXPECTED
    assert decoder.comments == 1
    assert decoder.malformed == 1  # the raw JSON line


def test_every_single_split_point_gives_same_events() -> None:
    for cut in range(len(TRANSCRIPT) + 1):
        assert decode([TRANSCRIPT[:cut], TRANSCRIPT[cut:]])[0] == EXPECTED, cut


def test_byte_at_a_time() -> None:
    assert decode([bytes([b]) for b in TRANSCRIPT])[0] == EXPECTED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_any_chunking_gives_same_events(cuts: list[int]) -> None:
    assert decode(split_at(TRANSCRIPT, cuts))[0] == EXPECTED


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([b"data: ", b"x" * 30, b"\n", b"\r", b":", b"event: e", b"y"]), max_size=40
    ).map(b"".join)
    | st.binary(max_size=400),
    st.lists(st.integers(min_value=0, max_value=400), max_size=20),
)
def test_arbitrary_bytes_never_raise_and_chunking_is_irrelevant(
    data: bytes, cuts: list[int]
) -> None:
    whole, _ = decode([data], max_line=64)
    assert decode(split_at(data, cuts), max_line=64)[0] == whole


def test_an_id_with_a_nul_is_ignored_and_others_are_kept() -> None:
    """The SSE spec: an ``id`` field whose value holds a NUL does not set the last event ID."""
    events = SseDecoder().feed(b"id: 7\ndata: a\n\nid: 8\x009\ndata: b\n\nid: 9\ndata: c\n\n")
    assert [(e.data, e.id) for e in events] == [(b"a", "7"), (b"b", "7"), (b"c", "9")]


def test_bom_is_dropped_and_missing_final_blank_line_still_dispatches() -> None:
    events, _ = decode([b"\xef\xbb\xbfdata: x\n\ndata: tail"])
    assert events == [SseEvent(b"x"), SseEvent(b"tail")]


def test_overlong_line_is_discarded_with_its_event_and_counted() -> None:
    long_line = b"data: " + b"x" * 5000 + b"\n\n"
    chunks = [b"data: a\n\n", *split_at(long_line, list(range(0, 5010, 100))), b"data: b\n\n"]
    events, decoder = decode(chunks, max_line=1000)
    assert events == [SseEvent(b"a"), SseEvent(b"b")]
    assert decoder.malformed == 1


def test_buffer_stays_bounded_while_discarding() -> None:
    decoder = SseDecoder(max_line=1000)
    decoder.feed(b"data: ")
    for _ in range(1000):
        decoder.feed(b"y" * 1000)
    assert decoder.buffered <= 1000
    assert decoder.feed(b"\n\ndata: ok\n\n") == [SseEvent(b"ok")]


def test_overlong_line_in_one_chunk_is_treated_as_when_split() -> None:
    data = b"data: a\n\ndata: " + b"z" * 100 + b"\n\ndata: b\n\n"
    whole, d1 = decode([data], max_line=20)
    split, d2 = decode([data[:30], data[30:]], max_line=20)
    assert whole == split == [SseEvent(b"a"), SseEvent(b"b")]
    assert d1.malformed == d2.malformed == 1


sse_streams = st.lists(
    st.sampled_from([*PIECES, b'data: {"a":1}\n\n', b"data:x\n\n", b"data: \n\n"])
    | st.binary(max_size=20),
    max_size=40,
).map(b"".join)


@FAST
@given(sse_streams, cut_lists, st.sampled_from([8, 64, 1 << 20]))
def test_sse_payloads_fast_path_gives_the_events_of_feed(
    data: bytes, cuts: list[int], limit: int
) -> None:
    fast, slow = SseDecoder(limit), SseDecoder(limit)
    got: list[bytes] = []
    want: list[bytes] = []
    for chunk in split_at(data, cuts):
        got.extend(fast.payloads(chunk))
        want.extend(e.data for e in slow.feed(chunk))
    got.extend(fast.flush_payloads())
    want.extend(e.data for e in slow.flush())
    assert got == want
    assert (fast.malformed, fast.comments) == (slow.malformed, slow.comments)
