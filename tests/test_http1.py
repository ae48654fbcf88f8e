"""The upstream leg's HTTP/1.1 response parsing, sans I/O: heads, and bodies under any chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmobs.http1 import (
    ChunkedBody,
    CloseBody,
    LengthBody,
    NoBody,
    ProtocolError,
    body_decoder,
    parse_head,
)


def test_head_is_parsed_with_repeated_headers_and_case_kept() -> None:
    head = parse_head(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nSet-Cookie: a=1\r\n"
        b"Set-Cookie: b=2\r\nX-Empty:\r\nx-request-id:  abc  "
    )
    assert (head.version, head.status, head.reason) == ((1, 1), 200, "OK")
    assert head.headers.getall("set-cookie") == ["a=1", "b=2"]
    assert head.headers["X-Empty"] == ""
    assert head.headers["X-Request-Id"] == "abc"
    assert next(iter(head.headers)) == "Content-Type"  # the engine's spelling is relayed
    assert head.keep_alive


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
    assert parse_head(raw).keep_alive is keep


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH_9.0",
        b"HTTP/2 200",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 OK",
        b"HTTP/1.1 200 OK\r\nno colon here",
        b"HTTP/1.1 200 OK\r\n folded: continuation",
        b"HTTP/1.1 200 OK\r\nBad Name : x",
    ],
)
def test_garbage_heads_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(raw)


def test_status_without_reason_is_accepted() -> None:
    head = parse_head(b"HTTP/1.1 204\r\n")
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
    assert type(body_decoder(parse_head(raw), method)) is kind


@pytest.mark.parametrize("length", [b"abc", b"5, 6", b"-1"])
def test_bad_content_length_is_a_protocol_error(length: bytes) -> None:
    with pytest.raises(ProtocolError):
        body_decoder(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: " + length), "GET")


def chunked(payloads: list[bytes], ext: bool = False, trailer: bool = False) -> bytes:
    out = b"".join(
        b"%x%s\r\n%s\r\n" % (len(p), b";name=v" if ext else b"", p) for p in payloads if p
    )
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"


def feed_all(decoder: ChunkedBody | LengthBody, data: bytes, cuts: list[int]) -> bytes:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    return b"".join(decoder.feed(p) for p in pieces)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=40), max_size=8),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
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


def test_one_whole_chunk_per_read_is_returned_as_is() -> None:
    decoder = ChunkedBody()
    event = b"data: {}\n\n"
    assert decoder.feed(b"%x\r\n%s\r\n" % (len(event), event)) == event
    assert decoder.feed(b"0\r\n\r\n") == b""
    assert decoder.done


@pytest.mark.parametrize(
    "data",
    [b"zz\r\nabc\r\n", b"5\r\nabcdeXX\r\n", b"+5\r\nabcde\r\n", b"1" * 5000],
)
def test_broken_chunked_framing_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ChunkedBody().feed(data)


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
