"""HTTP/1.1 bodies (``http1.bodies``): every decoder gives the same payload, end and extra
bytes under any chunking, a read at a time or a share at a time; strict for a client's
body, tolerant for an engine's; every line and section bounded."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from llmobs.wire.http1 import (
    FEED_BUDGET,
    MAX_CHUNK_LINE,
    MAX_TRAILER_BYTES,
    ChunkedBody,
    CloseBody,
    FieldsTooLarge,
    Frames,
    LengthBody,
    ProtocolError,
    parse_request_head,
    request_body_decoder,
)
from tests.support.chunked_framing import (
    READ_PIECES,
    same_length_reads,
    strict_chunks,
    strictly_whole,
)

PAYLOADS = st.lists(st.binary(min_size=0, max_size=40), max_size=8)  # a body's chunks
CUTS = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)  # where reads end


def chunked(payloads: list[bytes], ext: bool = False, trailer: bool = False) -> bytes:
    out = b"".join(
        b"%x%s\r\n%s\r\n" % (len(p), b";name=v" if ext else b"", p) for p in payloads if p
    )
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"


def feed_all(decoder: ChunkedBody | LengthBody, data: bytes, cuts: list[int]) -> bytes:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    return b"".join(drain(decoder, p) for p in pieces)


def drain(decoder: ChunkedBody | LengthBody, read: bytes) -> bytes:
    """A read's whole payload: what ``feed`` gives, then each share it left (``backlog``),
    as the I/O layers take them over loop turns."""
    out = [decoder.feed(read)]
    while decoder.backlog:
        out.append(decoder.resume())
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@given(
    PAYLOADS,
    CUTS,
    st.booleans(),
    st.booleans(),
    st.binary(max_size=8),
)
def test_chunked_body_decodes_the_same_under_any_chunking(
    payloads: list[bytes], cuts: list[int], ext: bool, trailer: bool, after: bytes
) -> None:
    data = chunked(payloads, ext, trailer)
    decoder = ChunkedBody()
    assert feed_all(decoder, data + after, cuts) == b"".join(payloads)
    assert decoder.done
    assert decoder.extra == after


def tiny_chunks(count: int) -> bytes:
    return b"".join(b"1\r\n%c\r\n" % (97 + i % 26) for i in range(count))


@pytest.mark.parametrize("strict", [False, True])
def test_a_read_of_tiny_chunks_is_decoded_a_share_at_a_time(strict: bool) -> None:
    """The probe's upload: a read that is all framing (1-byte chunks). One ``feed`` decodes at
    most ``FEED_BUDGET`` chunks and leaves the rest (``backlog``), so that the connection can
    let the others run before it goes on (``resume``); the shares add up to the body."""
    count = 10 * FEED_BUDGET + 7
    body = tiny_chunks(count)
    decoder = ChunkedBody(strict=strict)
    first = decoder.feed(body + b"0\r\n\r\nNEXT")
    assert len(first) == FEED_BUDGET
    assert decoder.backlog and not decoder.whole and not decoder.done
    assert decoder.pending() == len(body) - 6 * FEED_BUDGET + len(b"0\r\n\r\nNEXT")
    shares = [first]
    while decoder.backlog:
        shares.append(decoder.resume())
        assert len(shares[-1]) <= FEED_BUDGET
    assert len(shares) == 11
    assert b"".join(shares) == bytes(97 + i % 26 for i in range(count))
    assert decoder.done and decoder.extra == b"NEXT" and decoder.pending() == 0


def test_long_framing_lines_count_against_the_budget() -> None:
    """A size line with a long extension costs a step per 64 bytes (the strict grammar's
    regex reads all of it): 4 lines of 4 KiB take a feed's whole share."""
    line = b"1;a=" + b"b" * 4000
    body = b"".join(line + b"\r\nx\r\n" for _ in range(10)) + b"0\r\n\r\n"
    decoder = ChunkedBody(strict=True)
    assert decoder.feed(body) == b"xxxx"
    assert decoder.backlog
    assert drain(decoder, b"") == b"x" * 6
    assert decoder.done


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3 * FEED_BUDGET), CUTS, st.booleans())
def test_shares_of_any_read_add_up_to_the_body(count: int, cuts: list[int], ext: bool) -> None:
    """Whatever the reads and wherever a share stops, the payload, the end and the bytes
    after it are what the decoder finds fed one byte at a time."""
    unit = b"1;e=v\r\n%c\r\n" if ext else b"1\r\n%c\r\n"
    data = b"".join(unit % (97 + i % 26) for i in range(count)) + b"0\r\n\r\nGET"
    decoder = ChunkedBody(strict=True)
    assert feed_all(decoder, data, cuts) == bytes(97 + i % 26 for i in range(count))
    assert decoder.done and decoder.extra == b"GET"


def test_a_read_that_comes_while_a_share_waits_keeps_its_order() -> None:
    decoder = ChunkedBody()
    first = decoder.feed(tiny_chunks(FEED_BUDGET + 3))
    assert decoder.backlog
    rest = drain(decoder, b"1\r\nZ\r\n0\r\n\r\n")  # a caller that did not resume first
    assert first + rest == tiny_chunks(FEED_BUDGET + 3)[3::6] + b"Z"
    assert decoder.done


@pytest.mark.parametrize("strict", [False, True])
def test_a_chunk_line_over_the_limit_is_refused_even_in_one_read(strict: bool) -> None:
    """The line limit held only for a line split over reads: a 100 KB extension that came
    whole in one read was taken."""
    decoder = ChunkedBody(strict=strict)
    with pytest.raises(ProtocolError, match="too long"):
        decoder.feed(b"1;a=" + b"b" * 100_000 + b"\r\nx\r\n0\r\n\r\n")
    at_limit = b"1;a=" + b"b" * (MAX_CHUNK_LINE - 5)  # with its CR: the limit exactly
    assert drain(ChunkedBody(strict=strict), at_limit + b"\r\nx\r\n0\r\n\r\n") == b"x"


@pytest.mark.parametrize("split", [False, True])
def test_a_trailer_section_over_its_limit_is_refused(split: bool) -> None:
    """Trailers were unbounded, and free of ``--max-body-bytes``: 3.3 million ``X:y`` lines
    stalled the other streams for seconds."""
    field = b"X:y\r\n"
    fits = b"1\r\nx\r\n0\r\n" + field * ((MAX_TRAILER_BYTES - 16) // len(field)) + b"\r\n"
    assert drain(ChunkedBody(strict=True), fits) == b"x"
    flood = b"1\r\nx\r\n0\r\n" + field * (MAX_TRAILER_BYTES // len(field) + 1) + b"\r\n"
    reads = [flood[i : i + 1000] for i in range(0, len(flood), 1000)] if split else [flood]
    decoder = ChunkedBody(strict=True)
    with pytest.raises(FieldsTooLarge):
        feed_reads(decoder, reads)
    with pytest.raises(FieldsTooLarge):  # one line, never ended
        drain(ChunkedBody(), b"0\r\nX: " + b"y" * MAX_TRAILER_BYTES)


def feed_reads(decoder: ChunkedBody, reads: list[bytes]) -> bytes:
    return b"".join(drain(decoder, read) for read in reads)


def test_one_whole_chunk_per_read_is_returned_as_is() -> None:
    decoder = ChunkedBody()
    event = b"data: {}\n\n"
    assert decoder.feed(b"%x\r\n%s\r\n" % (len(event), event)) == event
    assert decoder.feed(b"0\r\n\r\n") == b""
    assert decoder.done


@settings(max_examples=300, deadline=None)
@given(
    PAYLOADS,
    CUTS,
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_reads_marked_whole_can_be_relayed_as_they_came(
    payloads: list[bytes], cuts: list[int], ext: bool, trailer: bool, bare_lf: bool
) -> None:
    """What the relay does with a chunked body: a read marked ``whole`` goes on as it came
    (with the last chunk when it ended the body), any other is re-framed. The client must
    get a strictly framed body with the same payload, whatever the engine's framing."""
    data = chunked(payloads, ext, trailer)
    if bare_lf:  # the same framing with bare LF line ends (tolerated, never passed on)
        data = b"".join(b"%x\n%s\n" % (len(p), p) for p in payloads if p) + b"0\n\n"
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    decoder = ChunkedBody()
    relayed, ended = b"", False
    for piece in pieces:
        payload = decoder.feed(piece)
        if decoder.whole and payload:
            assert not ext and not bare_lf
        if decoder.whole and decoder.done:
            assert not trailer and not bare_lf
        if decoder.whole and payload:  # the relay's sink sees reads with a payload only
            relayed += piece
            ended = decoder.done
        elif payload:
            relayed += b"%x\r\n%s\r\n" % (len(payload), payload)
    assert decoder.done
    if not ended:
        relayed += b"0\r\n\r\n"
    assert b"".join(strict_chunks(relayed)) == b"".join(payloads)


@settings(max_examples=500, deadline=None)
@given(READ_PIECES)
@example([b"1\r\na\r\n", b"0" * 16 + b"1\r\nx\r\n"])  # a 17-character size line after a chunk
@example([b"1\r\na\r\n", b"0\r\nXY"])  # the last chunk, then two bytes that are not CRLF
def test_a_read_of_several_chunks_decodes_as_it_does_byte_by_byte(pieces: list[bytes]) -> None:
    """One read of many chunks (a busy engine's reads coalesce) takes a loop of its own
    (``bodies._scan``): the same payload, end and extra bytes as the line
    state machine finds fed one byte at a time, and marked whole exactly when it is."""
    read = b"".join(pieces)
    assume(read)  # uvloop never delivers an empty read
    fast, slow = ChunkedBody(), ChunkedBody()
    payload: bytes | None
    expected: bytes | None
    try:
        payload = fast.feed(read)
    except ProtocolError:
        payload = None
    try:
        expected = b"".join(slow.feed(read[i : i + 1]) for i in range(len(read)))
    except ProtocolError:
        expected = None
    assert payload == expected
    if payload is not None:
        assert (fast.done, fast.extra) == (slow.done, slow.extra)
        assert fast.whole == strictly_whole(read)


@settings(max_examples=400, deadline=None)
@given(same_length_reads(), st.booleans())
def test_remembered_read_lengths_decode_as_byte_by_byte(reads: list[bytes], reused: bool) -> None:
    """A read of a length that was one whole chunk before is checked against the size line
    remembered for that length and for its final CRLF (``ChunkedBody._frames``): fed read by
    read, a body decodes as it does fed one byte at a time, fails where that fails, and reads
    are marked whole exactly when they are, as long as every read before was whole. So with
    lengths that earlier responses remembered (the upstream pool shares them)."""
    frames: Frames = {}
    if reused:
        earlier = ChunkedBody(frames=frames)
        for known in (b"a", b"bc", b"x" * 16, b"z" * 30):
            earlier.feed(b"%x\r\n%s\r\n" % (len(known), known))
        assert len(frames) == 4
    fast, slow = ChunkedBody(frames=frames), ChunkedBody()
    aligned = True  # every read so far was whole: the next starts at a chunk
    for read in reads:
        try:
            payload: bytes | None = fast.feed(read)
        except ProtocolError:
            payload = None
        try:
            expected: bytes | None = b"".join(slow.feed(read[i : i + 1]) for i in range(len(read)))
        except ProtocolError:
            expected = None
        assert payload == expected, read
        if payload is None:
            return
        if aligned:
            assert fast.whole == strictly_whole(read), read
        aligned = aligned and fast.whole


def test_remembered_read_lengths_are_bounded() -> None:
    """The memory of read lengths is the whole pool's: it never holds more than 256 lengths,
    and when full it starts again, so that reads of many other lengths (bodies of all sizes)
    cannot keep a token event's length out of it for good."""
    frames: Frames = {}
    token = b"data: x\n\n"
    for size in range(1000, 1600):  # bodies of 600 other lengths, none a token's
        payload = b"p" * size
        decoder = ChunkedBody(frames=frames)
        assert decoder.feed(b"%x\r\n%s\r\n" % (size, payload)) == payload
        assert decoder.whole
        assert len(frames) <= 256
    decoder = ChunkedBody(frames=frames)
    assert decoder.feed(b"%x\r\n%s\r\n" % (len(token), token)) == token
    assert len(token) + 5 in frames  # remembered after the flood of other lengths
    assert decoder.feed(b"%x\r\n%s\r\n" % (len(token), token)) == token


def test_whole_reads_are_marked_as_such() -> None:
    event = b"data: {}\n\n"
    one = b"%x\r\n%s\r\n" % (len(event), event)
    decoder = ChunkedBody()
    decoder.feed(one)
    assert decoder.whole and not decoder.done
    decoder.feed(one + one)  # two chunks in one read
    assert decoder.whole
    decoder.feed(one[:5])  # a chunk cut short
    assert not decoder.whole
    decoder.feed(one[5:])  # its rest does not start at a chunk
    assert not decoder.whole
    decoder.feed(one + b"0\r\n\r\n")  # the last token and the last chunk
    assert decoder.whole and decoder.done
    decoder = ChunkedBody()
    decoder.feed(b"%x;ext=1\r\n%s\r\n" % (len(event), event))
    assert not decoder.whole  # the extension must not reach the client
    decoder.feed(one + b"0\r\nX-Trailer: 1\r\n\r\n")
    assert decoder.done and not decoder.whole  # nor the trailer
    for odd in (b"5\r\r\nhello\r\n", b"5\r\nhello\r\r\n", b"5\r\nhello\r\n0\r\n\r\r\n"):
        decoder = ChunkedBody()
        assert decoder.feed(odd) == b"hello"
        assert not decoder.whole, odd  # CR CR LF is tolerated, never passed on


@pytest.mark.parametrize(
    "data",
    [b"zz\r\nabc\r\n", b"5\r\nabcdeXX\r\n", b"+5\r\nabcde\r\n", b"1" * 5000],
)
def test_broken_chunked_framing_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ChunkedBody().feed(data)


LENIENT = [
    b"3\nabc\n0\n\n",  # bare LFs
    b"3;x\nabc\r\n0\r\n\r\n",  # a bare LF after an extension
    b"3\r\r\nabc\r\n0\r\n\r\n",  # CR CR LF
    b" 3 \r\nabc\r\n0\r\n\r\n",  # spaces around the size
    b"3 \r\nabc\r\n0\r\n\r\n",
    b"3;\r\nabc\r\n0\r\n\r\n",  # an empty extension
    b"3;a b\r\nabc\r\n0\r\n\r\n",  # an extension that is no token
    b'3;a="x\r\nabc\r\n0\r\n\r\n',  # an unclosed quoted string
]


@pytest.mark.parametrize("data", LENIENT)
def test_a_request_body_is_framed_strictly(data: bytes) -> None:
    """An engine's odd chunk framing is tolerated; a client's is refused (400): behind a
    front proxy that reads such a form another way, the two would disagree on where the
    request ends, and a second request could hide in the first's body (smuggling)."""
    assert ChunkedBody().feed(data) == b"abc"
    decoder = request_body_decoder(
        parse_request_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked")
    )
    assert isinstance(decoder, ChunkedBody)
    with pytest.raises(ProtocolError):
        feed_bytewise(decoder, data)


def feed_bytewise(decoder: ChunkedBody, data: bytes) -> None:
    for i in range(len(data)):  # at any split: byte by byte
        decoder.feed(data[i : i + 1])


@pytest.mark.parametrize(
    "data",
    [
        b"3\r\nabc\r\n0\r\n\r\n",
        b"3;a\r\nabc\r\n0\r\n\r\n",
        b"3 ; a = b;c\r\nabc\r\n0\r\n\r\n",
        b'3;a="x \\" y"\r\nabc\r\n0;z\r\nX-Trailer: 1\r\n\r\n',
    ],
)
def test_a_strict_body_takes_what_the_grammar_allows(data: bytes) -> None:
    for cut in range(len(data) + 1):
        decoder = ChunkedBody(strict=True)
        assert decoder.feed(data[:cut]) + decoder.feed(data[cut:]) == b"abc"
        assert decoder.done


@given(st.binary(max_size=100), st.lists(st.integers(0, 200), max_size=6), st.binary(max_size=5))
def test_length_body_stops_at_its_length(body: bytes, cuts: list[int], after: bytes) -> None:
    decoder = LengthBody(len(body))
    assert feed_all(decoder, body + after, cuts) == body
    assert decoder.done is True
    assert decoder.extra == after


def test_close_body_ends_at_eof_only() -> None:
    decoder = CloseBody()
    assert decoder.feed(b"abc") == b"abc"
    assert not decoder.done
    assert decoder.eof()
    assert decoder.done
    assert not ChunkedBody().eof()  # a chunked body cut by a close is not complete
