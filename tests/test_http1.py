"""HTTP/1.1 sans I/O: the upstream leg's responses (heads, and bodies under any chunking) and
the client leg's requests (heads, body framing)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from llmobs.http1 import (
    FEED_BUDGET,
    MAX_CHUNK_LINE,
    MAX_REQUEST_HEADERS,
    MAX_TRAILER_BYTES,
    BadRequest,
    ChunkedBody,
    CloseBody,
    FieldsTooLarge,
    Frames,
    LengthBody,
    NoBody,
    ProtocolError,
    RequestHead,
    body_decoder,
    climbs_above_root,
    keep_alive,
    parse_request_head,
    parse_response_head,
    request_body_decoder,
    request_keep_alive,
)


def test_head_is_parsed_with_repeated_headers_and_case_kept() -> None:
    head = parse_response_head(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nSet-Cookie: a=1\r\n"
        b"Set-Cookie: b=2\r\nX-Empty:\r\nx-request-id:  abc  "
    )
    assert (head.version, head.status, head.reason) == ((1, 1), 200, "OK")
    assert head.headers.getall("set-cookie") == ["a=1", "b=2"]
    assert head.headers["X-Empty"] == ""
    assert head.headers["X-Request-Id"] == "abc"
    assert next(iter(head.headers)) == "Content-Type"  # the engine's spelling is relayed
    assert keep_alive(head.version, head.headers)


@pytest.mark.parametrize(
    ("raw", "keep"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close", False),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Upgrade", True),
        (b"HTTP/1.0 200 OK", False),
        (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive", True),
    ],
)
def test_keep_alive_follows_version_and_connection(raw: bytes, keep: bool) -> None:
    head = parse_response_head(raw)
    assert keep_alive(head.version, head.headers) is keep


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH_9.0",
        b"HTTP/2 200",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 OK",
        b"HTTP/1.1 200 OK\r\nno colon here",
        b"HTTP/1.1 200 OK\r\n folded: continuation",
        b"HTTP/1.1 200 OK\r\n\tfolded: continuation",
        b"HTTP/1.1 200 OK\r\nBad Name : x",
        b"HTTP/1.1 200 OK\r\nX-A: a\rSet-Cookie: inj=1",  # a bare CR inside a value
        b"HTTP/1.1 200 OK\r\nX-A: a\x00b",  # a NUL inside a value
        b"HTTP/1.1 200 OK\r\nX A: b",  # a space inside a name
        b"HTTP/1.1 200 OK\r\nX(A): b",  # a name that is not a token
        b"HTTP/1.1 200 OK\r\nX-\xc9: b",
        b"HTTP/1.1 200 O\rK",  # a bare CR inside the reason phrase
        b"HTTP/1.1 200 O\x00K",
    ],
)
def test_garbage_heads_are_protocol_errors(raw: bytes) -> None:
    """Every header goes on to the client as the engine wrote it: one that would split the
    client's response (a bare CR, a NUL) or that is no header at all is refused (nginx: 502)."""
    with pytest.raises(ProtocolError):
        parse_response_head(raw)


def test_status_without_reason_is_accepted() -> None:
    head = parse_response_head(b"HTTP/1.1 204\r\n")
    assert (head.status, head.reason) == (204, "")


@pytest.mark.parametrize(
    ("raw", "method", "kind"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", "POST", ChunkedBody),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked", "POST", ChunkedBody),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip", "POST", CloseBody),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5", "POST", LengthBody),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5", "POST", LengthBody),
        (b"HTTP/1.1 200 OK", "POST", CloseBody),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5", "HEAD", NoBody),
        (b"HTTP/1.1 204 No Content", "POST", NoBody),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10", "GET", NoBody),
    ],
)
def test_body_framing_follows_rfc_9112(raw: bytes, method: str, kind: type) -> None:
    assert type(body_decoder(parse_response_head(raw), method)) is kind


@pytest.mark.parametrize("length", [b"abc", b"5, 6", b"-1"])
def test_bad_content_length_is_a_protocol_error(length: bytes) -> None:
    with pytest.raises(ProtocolError):
        body_decoder(parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: " + length), "GET")


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


def strict_chunks(data: bytes) -> list[bytes]:
    """The payloads of a chunked body framed as strictly as a client may demand: bare hex
    sizes, CRLF line ends, no extension, no trailer, nothing after the last chunk."""
    out: list[bytes] = []
    while True:
        end = data.index(b"\r\n")
        size_line = data[:end]
        assert size_line and not size_line.strip(b"0123456789abcdefABCDEF"), size_line
        size = int(size_line, 16)
        if size == 0:
            assert data[end:] == b"\r\n\r\n"
            return out
        out.append(data[end + 2 : end + 2 + size])
        assert data[end + 2 + size : end + 4 + size] == b"\r\n"
        data = data[end + 4 + size :]


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


def strictly_whole(read: bytes) -> bool:
    """Whether ``read`` is whole chunks, strictly framed, the last chunk (with no trailer)
    ending it if it is there: what may go on to a chunked client as it came."""
    pos = 0
    while pos < len(read):
        end = read.find(b"\r\n", pos)
        line = read[pos:end]
        if end < 0 or not 0 < len(line) <= 16 or line.strip(b"0123456789abcdefABCDEF"):
            return False
        size = int(line, 16)
        if size == 0:
            return read[end:] == b"\r\n\r\n"
        if read[end + 2 + size : end + 4 + size] != b"\r\n":
            return False
        pos = end + 4 + size
    return pos > 0


_PAYLOAD = st.binary(min_size=1, max_size=20)
READ_PIECES = st.lists(
    st.one_of(
        _PAYLOAD.map(lambda p: b"%x\r\n%s\r\n" % (len(p), p)),  # a whole chunk
        _PAYLOAD.map(lambda p: b"%X\r\n%s\r\n" % (len(p), p)),  # upper-case size
        _PAYLOAD.map(lambda p: b"%x;e=1\r\n%s\r\n" % (len(p), p)),  # an extension
        _PAYLOAD.map(lambda p: b"%x\r\n%sXY" % (len(p), p)),  # no CRLF after the data
        _PAYLOAD.map(lambda p: b"+%x\r\n%s\r\n" % (len(p), p)),  # not bare hex
        _PAYLOAD.map(lambda p: b"%x\r\n%s" % (len(p) + 3, p)),  # cut short
        st.sampled_from(
            [
                b"0\r\n\r\n",
                b"0\r\nX-T: 1\r\n\r\n",
                b"0\r\nXY",  # the last chunk, then two bytes that are not its CRLF
                b"0\r\n\r\r",
                b"0" * 16 + b"1\r\nx\r\n",  # a 17-character size line: refused
                b"0" * 15 + b"1\r\nx\r\n",  # 16: the longest taken
                b"\r\n",
                b"\r\n\r\n",
                b"0",
                b"\n",
            ]
        ),
        st.binary(max_size=6),
    ),
    min_size=1,
    max_size=6,
)


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


@st.composite
def same_length_reads(draw: st.DrawFn) -> list[bytes]:
    """Reads of a few lengths, each a whole chunk or one made wrong where a remembered
    length would not look (its last two bytes, its size line's digits or case), so that
    ``ChunkedBody._frames`` is asked about reads it must not take."""
    reads = []
    for _ in range(draw(st.integers(1, 12))):
        payload = draw(st.sampled_from([b"a", b"bc", b"de", b"x" * 16, b"y" * 16, b"z" * 30]))
        read = b"%x\r\n%s\r\n" % (len(payload), payload)
        how = draw(st.sampled_from(["good", "good", "good", "tail", "upper", "digit", "two"]))
        if how == "tail":
            read = read[:-2] + draw(st.sampled_from([b"\r\r", b"XY", b"\n\n", b"\r\n"]))
        elif how == "upper":
            read = read.upper()
        elif how == "digit":  # the same length, another size: a chunk and a cut one
            read = b"%x" % (len(payload) - 1) + read[read.index(b"\r\n") :]
        elif how == "two" and len(payload) > 6:  # the same length, two chunks
            read = b"1\r\nq\r\n" + b"%x\r\n%s\r\n" % (len(payload) - 6, payload[6:])
        reads.append(read)
    return reads


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
    decoder = decoder_for(b"Transfer-Encoding: chunked")
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


# -- the client leg: request heads and request body framing ---------------------------------


def request_head(*lines: bytes) -> RequestHead:
    return parse_request_head(b"\r\n".join(lines))


def test_a_request_head_is_parsed_with_order_duplicates_and_spelling_kept() -> None:
    head = request_head(
        b"POST /v1/chat/completions?stream=1 HTTP/1.1",
        b"Host: 127.0.0.1:8000",
        b"X-Tag: a",
        b"content-type:application/json",
        b"x-tag:  b \t",
        b"X-Empty:",
    )
    assert (head.method, head.target, head.version) == (
        "POST",
        "/v1/chat/completions?stream=1",
        (1, 1),
    )
    assert list(head.headers.items()) == [
        ("Host", "127.0.0.1:8000"),
        ("X-Tag", "a"),
        ("content-type", "application/json"),
        ("x-tag", "b"),
        ("X-Empty", ""),
    ]
    assert head.headers.getall("X-TAG") == ["a", "b"]
    assert head.path == "/v1/chat/completions"
    assert request_keep_alive(head)


def test_a_value_keeps_inner_whitespace_and_latin_1_bytes() -> None:
    head = request_head(b"GET / HTTP/1.1", b"X-V: a \t b\xe9")
    assert head.headers["x-v"] == "a \t b\xe9"


@pytest.mark.parametrize(
    ("target", "origin"),
    [
        (b"http://example.com/v1/models", "/v1/models"),
        (b"HTTPS://example.com:8443/a/b?c=d", "/a/b?c=d"),
        (b"http://example.com", "/"),
        (b"http://example.com/", "/"),
    ],
)
def test_an_absolute_form_target_becomes_origin_form(target: bytes, origin: str) -> None:
    head = parse_request_head(b"GET " + target + b" HTTP/1.1")
    assert head.target == origin


def test_an_absolute_form_target_without_a_path_keeps_its_query() -> None:
    """RFC 3986 3.2: the authority ends at "/", "?" or "#"; "http://h?x=1" is path "" and
    query "x=1", so its origin form is "/?x=1" (RFC 9112 3.2.1), not "/"."""
    head = parse_request_head(b"GET http://example.com?x=1 HTTP/1.1")
    assert head.target == "/?x=1"


@pytest.mark.parametrize("target", [b"ftp://example.com/x", b"example.com:443", b"*", b"v1/x"])
def test_a_target_in_no_supported_form_is_400(target: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"GET " + target + b" HTTP/1.1")
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/a%20b?q=%20x", "/v1/a b"),
        ("/v1/%E2%82%AC", "/v1/\u20ac"),
        ("/x?y?z", "/x"),
        ("/?q", "/"),
    ],
)
def test_path_is_percent_decoded_without_the_query(target: str, path: str) -> None:
    head = parse_request_head(b"GET " + target.encode() + b" HTTP/1.1")
    assert head.target == target  # as sent
    assert head.path == path


@pytest.mark.parametrize(
    ("version", "connection", "keep"),
    [
        (b"HTTP/1.1", [], True),
        (b"HTTP/1.1", [b"close"], False),
        (b"HTTP/1.1", [b"Keep-Alive, Close"], False),
        (b"HTTP/1.1", [b"upgrade", b"CLOSE"], False),
        (b"HTTP/1.1", [b"keep-alive"], True),
        (b"HTTP/1.0", [], False),
        (b"HTTP/1.0", [b"Keep-Alive"], True),
        (b"HTTP/1.0", [b"foo, keep-alive"], True),
        (b"HTTP/1.0", [b"close"], False),
    ],
)
def test_request_keep_alive_follows_version_and_connection_tokens(
    version: bytes, connection: list[bytes], keep: bool
) -> None:
    lines = [b"GET / " + version, *(b"Connection: " + c for c in connection)]
    head = request_head(*lines)
    assert head.version == (1, int(version[-1:]))
    assert request_keep_alive(head) is keep


@pytest.mark.parametrize(
    ("target", "climbs"),
    [
        ("/../admin", True),
        ("/a/../../admin", True),
        ("/%2e%2e/admin", True),  # decoded, as an engine's router may
        ("/%2E%2E/admin", True),
        ("/a/%2e%2e/%2e%2e/b?x=1", True),
        ("/a%2f..%2f..%2fadmin", True),  # an encoded slash, decoded too (conservative)
        ("/./../x", True),
        ("/..", True),
        ("/a/../b", False),  # stays inside: the engine resolves it to /b
        ("/a//../b", False),  # an empty segment is a segment (RFC 3986 5.2.4)
        ("/v1/./models", False),
        ("/v1/models/llama-3.1..8b", False),  # dots inside a segment are no dot segment
        ("/...", False),
        ("/?q=/../../x", False),  # the query is not the path
    ],
)
def test_dot_segments_that_climb_above_the_root_are_found(target: str, climbs: bool) -> None:
    assert climbs_above_root(target) is climbs


@pytest.mark.parametrize("target", [b"/../admin", b"/v1/%2e%2e/%2e%2e/admin"])
def test_a_path_that_climbs_above_the_root_is_400(target: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"GET " + target + b" HTTP/1.1\r\nHost: x")
    assert info.value.status == 400


@pytest.mark.parametrize("target", [b"example.com:443", b"/", b"http://example.com/"])
def test_connect_is_405(target: bytes) -> None:
    """A tunnel is no request for the engine (nginx answers 405 itself)."""
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"CONNECT " + target + b" HTTP/1.1\r\nHost: x")
    assert info.value.status == 405


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/1.1\r\nX-A: one\r\n two", 400),  # obsolete line folding
        (b"GET / HTTP/1.1\r\nX-A: one\r\n\ttwo", 400),
        (b"GET / HTTP/1.1\r\n X-A: one", 400),  # whitespace before the first field
        (b"GET / HTTP/1.1\r\nX-A : one", 400),  # whitespace before the colon
        (b"GET / HTTP/1.1\r\nX-A\t: one", 400),
        (b"GET / HTTP/1.1\r\nX-A: a\rb", 400),  # CR inside a value
        (b"GET / HTTP/1.1\r\nX-A: a\x00b", 400),  # NUL inside a value
        (b"GET / HTTP/1.1\r\nX-A: a\nX-B: b", 400),  # bare LF
        (b"GET / HTTP/1.1\r\nno colon", 400),
        (b"GET / HTTP/1.1\r\n: empty name", 400),
        (b"GET / HTTP/1.1\r\nX(A): b", 400),  # not a token
        (b"GET /", 400),  # two parts
        (b"GET / HTTP/1.1 extra", 400),  # four parts
        (b"GET  / HTTP/1.1", 400),  # an empty part
        (b"GET  HTTP/1.1", 400),
        (b" / HTTP/1.1", 400),  # no method
        (b"G(T / HTTP/1.1", 400),  # method not a token
        (b"G\xc9T / HTTP/1.1", 400),
        (b"GET / http/1.1", 400),
        (b"GET / HTTP/11", 400),
        (b"GET / HTTP/1.10", 400),
        (b"", 400),
        (b"GET / HTTP/2.0", 505),
        (b"GET / HTTP/1.2", 505),
        (b"GET / HTTP/0.9", 505),
    ],
)
def test_a_bad_request_head_is_refused_with_its_status(raw: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request_head(raw)
    assert info.value.status == status


def test_too_many_header_fields_is_431_and_the_limit_itself_is_fine() -> None:
    fields = [b"X-%d: v" % i for i in range(MAX_REQUEST_HEADERS)]
    assert len(request_head(b"GET / HTTP/1.1", *fields).headers) == MAX_REQUEST_HEADERS
    with pytest.raises(BadRequest) as info:
        request_head(b"GET / HTTP/1.1", *fields, b"X-One-More: v")
    assert info.value.status == 431


@pytest.mark.parametrize(
    "target", [b"/a\rb", b"/a\nX-Injected:\t1", b"/a\x00b", b"/a\tb", b"/a\x1fb", b"/a\x7fb"]
)
def test_a_control_character_in_the_request_target_is_400(target: bytes) -> None:
    """RFC 9112 3.2 / 2.2: a target is URI characters; a bare CR or LF in it is invalid. The
    relay writes ``target`` verbatim into the upstream request line, so one that gets through
    here injects a header (or a line) into the request the engine sees."""
    with pytest.raises(BadRequest) as info:
        parse_request_head(b"GET " + target + b" HTTP/1.1\r\nHost: x")
    assert info.value.status == 400


def test_a_target_with_bytes_beyond_ascii_is_passed_on_as_sent() -> None:
    """Not URI characters either, but not dangerous in a request line, and sent by clients
    that do not encode UTF-8 paths: relayed unchanged, as nginx does."""
    head = parse_request_head(b"GET /caf\xc3\xa9?q=\xff HTTP/1.1\r\nHost: x")
    assert head.target == "/caf\xc3\xa9?q=\xff"


@pytest.mark.parametrize(
    "fields",
    [[], [b"Host: a", b"Host: b"], [b"Host: a b"]],
    ids=["no-host", "two-hosts", "bad-host"],
)
def test_host_is_not_checked_the_relay_sends_its_own(fields: list[bytes]) -> None:
    """RFC 9112 3.2 has an origin server refuse an HTTP/1.1 request with no Host, two, or an
    invalid one. The sidecar is no origin: it routes nothing by Host and sends the engine's
    own ``Host`` upstream (``upstream.request_head``), so it passes such a request on, as
    aiohttp's server did before, rather than refuse what the engine would have served."""
    head = request_head(b"GET / HTTP/1.1", *fields)
    assert head.headers.getall("Host", []) == [f.split(b": ", 1)[1].decode() for f in fields]


def decoder_for(*fields: bytes) -> object:
    return request_body_decoder(request_head(b"POST / HTTP/1.1", *fields))


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ([], type(None)),
        ([b"Content-Length: 0"], type(None)),
        ([b"Content-Length: 5"], LengthBody),
        ([b"Content-Length: 5, 5"], LengthBody),
        ([b"Content-Length: 5", b"Content-Length: 5"], LengthBody),
        ([b"Transfer-Encoding: chunked"], ChunkedBody),
        ([b"Transfer-Encoding: Chunked"], ChunkedBody),
    ],
)
def test_request_body_framing(fields: list[bytes], kind: type) -> None:
    decoder = decoder_for(*fields)
    assert type(decoder) is kind
    if isinstance(decoder, LengthBody):
        assert decoder.remaining == 5


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ([b"Content-Length: 5", b"Transfer-Encoding: chunked"], 400),  # both framings
        ([b"Transfer-Encoding: chunked", b"Content-Length: 0"], 400),
        ([b"Transfer-Encoding: gzip, chunked"], 501),
        ([b"Transfer-Encoding: gzip", b"Transfer-Encoding: chunked"], 501),
        ([b"Transfer-Encoding: chunked, gzip"], 400),  # chunked not last
        ([b"Transfer-Encoding: gzip"], 400),
        ([b"Transfer-Encoding: "], 400),
        ([b"Content-Length: 5, 6"], 400),  # conflicting lengths
        ([b"Content-Length: 5", b"Content-Length: 6"], 400),
        ([b"Content-Length: -1"], 400),
        ([b"Content-Length: +5"], 400),
        ([b"Content-Length: 0x5"], 400),
        ([b"Content-Length: "], 400),
        ([b"Content-Length: 1234567890123456789"], 400),  # 19 digits
    ],
)
def test_bad_request_body_framing_is_refused(fields: list[bytes], status: int) -> None:
    with pytest.raises(BadRequest) as info:
        decoder_for(*fields)
    assert info.value.status == status


@pytest.mark.parametrize("digit", [b"\xb2", b"\xb9", b"1\xb3"])
def test_a_non_ascii_digit_content_length_is_a_400_not_a_value_error(digit: bytes) -> None:
    """``str.isdigit`` is true for superscript digits (latin-1 "\\xb2" is "²"), which
    ``int`` refuses: a ValueError escapes ``data_received`` and the client gets no 400."""
    with pytest.raises(BadRequest) as info:
        decoder_for(b"Content-Length: " + digit)
    assert info.value.status == 400


@pytest.mark.parametrize("digit", [b"\xb2", b"\xb9"])
def test_a_non_ascii_digit_response_content_length_is_a_protocol_error(digit: bytes) -> None:
    with pytest.raises(ProtocolError):
        body_decoder(parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: " + digit), "GET")


_TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_tokens = st.text(alphabet=_TOKEN_CHARS, min_size=1, max_size=12)
_value_chars = st.sampled_from(
    [chr(c) for c in range(0x20, 0x7F)] + ["\t"] + [chr(c) for c in range(0x80, 0x100)]
)
_values = st.text(alphabet=_value_chars, max_size=30).map(lambda v: v.strip(" \t"))
_targets = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~%!$&'()*+,;=:@/?", max_size=30
).map(lambda t: "/" + t)


@settings(max_examples=300, deadline=None)
@given(
    _tokens,
    _targets,
    st.sampled_from([b"HTTP/1.0", b"HTTP/1.1"]),
    st.lists(st.tuples(_tokens, _values), max_size=MAX_REQUEST_HEADERS),
)
def test_a_head_of_valid_tokens_and_values_round_trips(
    method: str, target: str, version: bytes, fields: list[tuple[str, str]]
) -> None:
    lines = [b"%s %s %s" % (method.encode(), target.encode(), version)]
    lines += [name.encode() + b": " + value.encode("latin-1") for name, value in fields]
    head = parse_request_head(b"\r\n".join(lines))
    assert head.method == method
    assert head.target == target
    assert head.version == (1, int(version[-1:]))
    assert list(head.headers.items()) == fields


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_tokens, st.binary(max_size=20)), max_size=6))
def test_any_request_head_either_parses_or_is_a_bad_request(
    fields: list[tuple[str, bytes]],
) -> None:
    """Whatever a client sends, the server gets a head (and a body decoder) or a
    ``BadRequest`` to answer with: never another exception."""
    raw = b"\r\n".join([b"POST / HTTP/1.1", *(n.encode() + b": " + v for n, v in fields)])
    with contextlib.suppress(BadRequest):
        request_body_decoder(parse_request_head(raw))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["Content-Length", "Transfer-Encoding"]),
    st.text(alphabet=[chr(c) for c in range(0x20, 0x100)], max_size=8),
)
def test_any_framing_header_value_gives_a_decoder_or_a_bad_request(name: str, value: str) -> None:
    raw = b"POST / HTTP/1.1\r\n" + name.encode() + b": " + value.strip(" ").encode("latin-1")
    with contextlib.suppress(BadRequest):
        request_body_decoder(parse_request_head(raw))
