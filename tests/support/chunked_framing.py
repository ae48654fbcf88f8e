"""Chunked framing as the relay may pass it on, for the property tests of the body decoders
(tests/unit/wire/http1/test_bodies.py): what a strictly framed body holds and whether a read is
strictly whole chunks, written plainly as the reference the decoders' fast paths are held to,
and the engines' reads (good, odd and broken) those tests draw."""

from __future__ import annotations

from hypothesis import strategies as st


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
