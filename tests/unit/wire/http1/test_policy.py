"""HTTP/1.1 policy, without sockets (``http1.policy``): which responses have a body, how a
response to the client is framed, which connections may be kept, when ``100 Continue`` is due,
and the one Content-Length validator both legs use."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from llmobs.wire.http1 import (
    BadRequest,
    ChunkedBody,
    CloseBody,
    Frames,
    LengthBody,
    NoBody,
    ProtocolError,
    ResponseFraming,
    body_decoder,
    content_length,
    declared_length,
    expects_continue,
    parse_request_head,
    parse_response_head,
    request_body_decoder,
    request_keep_alive,
    response_framing,
    response_has_body,
    reusable,
)


@pytest.mark.parametrize(
    ("method", "status", "has"),
    [
        ("GET", 200, True),
        ("POST", 500, True),
        ("HEAD", 200, False),
        ("GET", 204, False),
        ("GET", 304, False),
        ("GET", 100, False),
        ("GET", 199, False),
        ("GET", 205, True),
    ],
)
def test_which_responses_have_a_body(method: str, status: int, has: bool) -> None:
    assert response_has_body(method, status) is has


@pytest.mark.parametrize(
    ("method", "status", "version", "length", "framing"),
    [
        ("GET", 200, (1, 1), 5, ResponseFraming.LENGTH),
        ("GET", 200, (1, 1), None, ResponseFraming.CHUNKED),
        ("GET", 200, (1, 0), None, ResponseFraming.CLOSE),  # HTTP/1.0 has no chunked
        ("GET", 200, (1, 0), 0, ResponseFraming.LENGTH),
        ("HEAD", 200, (1, 1), 5, ResponseFraming.NONE),
        ("POST", 204, (1, 1), None, ResponseFraming.NONE),
        ("GET", 304, (1, 0), 10, ResponseFraming.NONE),
    ],
)
def test_a_response_to_the_client_is_framed_by_its_length_and_the_clients_version(
    method: str, status: int, version: tuple[int, int], length: int | None, framing: ResponseFraming
) -> None:
    assert response_framing(method, status, version, length) is framing


@pytest.mark.parametrize(
    ("lines", "keep"),
    [
        ((b"GET / HTTP/1.1",), True),
        ((b"GET / HTTP/1.1", b"Connection: close"), False),
        ((b"GET / HTTP/1.0",), False),
        ((b"GET / HTTP/1.0", b"Connection: keep-alive"), True),
        # HTTP/1.1 is kept unless "close" is among the options, whatever others it names
        ((b"GET / HTTP/1.1", b"Connection: Upgrade"), True),
        ((b"GET / HTTP/1.1", b"Connection: keep-alive"), True),
        ((b"GET / HTTP/1.1", b"Connection: close, Upgrade"), False),  # a list of options
        ((b"GET / HTTP/1.1", b"Connection: Upgrade,Close"), False),
        ((b"GET / HTTP/1.1", b"Connection: Upgrade", b"Connection: close"), False),  # 2 lines
        ((b"GET / HTTP/1.0", b"Connection: keep-alive, Upgrade"), True),
        ((b"GET / HTTP/1.0", b"Connection: Upgrade"), False),
        # RFC 9112 6.1: HTTP/1.0 and a transfer coding: the framing is faulty, close after it
        ((b"POST / HTTP/1.0", b"Connection: keep-alive", b"Transfer-Encoding: chunked"), False),
        ((b"POST / HTTP/1.1", b"Transfer-Encoding: chunked"), True),  # 1.1's framing is sound
    ],
)
def test_which_client_connections_may_be_kept(lines: tuple[bytes, ...], keep: bool) -> None:
    head = parse_request_head(b"\r\n".join(lines))
    assert request_keep_alive(head) is keep


@pytest.mark.parametrize(
    ("lines", "expects"),
    [
        ((b"POST / HTTP/1.1", b"Expect: 100-continue"), True),
        ((b"POST / HTTP/1.1", b"Expect: 100-Continue"), True),
        ((b"POST / HTTP/1.0", b"Expect: 100-continue"), False),  # 1.0 has no interim answer
        ((b"POST / HTTP/1.1",), False),
        ((b"POST / HTTP/1.1", b"Expect: something-else"), False),
    ],
)
def test_when_100_continue_is_due(lines: tuple[bytes, ...], expects: bool) -> None:
    assert expects_continue(parse_request_head(b"\r\n".join(lines))) is expects


@pytest.mark.parametrize(
    ("raw", "keep"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2", True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close", False),
        (b"HTTP/1.1 200 OK", False),  # no framing: the body ends with the connection
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive", True),
        # both framings: a transfer coding wins for this response, then the connection goes
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2", False),
    ],
)
def test_which_engine_connections_may_carry_another_request(raw: bytes, keep: bool) -> None:
    head = parse_response_head(raw)
    assert reusable(head, body_decoder(head, "POST")) is keep


@pytest.mark.parametrize(
    ("lengths", "value"),
    [
        (["5"], 5),
        (["5, 5"], 5),  # a list of one value, repeated (RFC 9110 8.6)
        (["5", " 5 "], 5),
        (["0"], 0),
        (["9" * 18], int("9" * 18)),
    ],
)
def test_the_one_length_a_head_declares(lengths: list[str], value: int) -> None:
    assert declared_length(lengths) == value


@pytest.mark.parametrize(
    ("lengths", "declared"),
    [
        (["5", "6"], ["5", "6"]),
        (["5, 6", "5"], ["5", "6"]),
        (["abc"], ["abc"]),
        ([" 5x "], ["5x"]),
        ([], []),
    ],
)
def test_a_refused_length_is_reported_as_declared(lengths: list[str], declared: list[str]) -> None:
    """The error names the values the lines declare (each once), and nothing else."""
    message = f"invalid Content-Length: {declared!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        declared_length(lengths)


@pytest.mark.parametrize(
    "lengths", [["5, 6"], ["5", "6"], ["-1"], ["+5"], ["5x"], [""], ["²"], ["1" * 19], []]
)
def test_a_length_that_is_not_one_number_is_refused_by_both_legs(lengths: list[str]) -> None:
    with pytest.raises(ValueError, match="Content-Length"):
        declared_length(lengths)
    headers = CIMultiDict(("Content-Length", v) for v in lengths)
    assert content_length(headers) is None
    if not lengths:
        return
    raw = b"HTTP/1.1 200 OK\r\n" + b"\r\n".join(b"Content-Length: " + v.encode() for v in lengths)
    with pytest.raises(ProtocolError):  # the engine's response: a 502
        body_decoder(parse_response_head(raw), "GET")
    head = parse_request_head(
        b"POST / HTTP/1.1\r\n" + b"\r\n".join(b"Content-Length: " + v.encode() for v in lengths)
    )
    with pytest.raises(BadRequest) as info:  # the client's request: a 400
        request_body_decoder(head)
    assert info.value.status == 400


@given(st.integers(min_value=0, max_value=10**18 - 1), st.integers(1, 3))
def test_any_valid_length_is_read_the_same_by_both_legs(length: int, repeats: int) -> None:
    value = ", ".join([str(length)] * repeats).encode()
    response = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: " + value)
    decoder = body_decoder(response, "GET")
    assert isinstance(decoder, LengthBody) and decoder.remaining == length
    assert content_length(response.headers) == length
    request = parse_request_head(b"POST / HTTP/1.1\r\nContent-Length: " + value)
    body = request_body_decoder(request)
    assert (body.remaining if isinstance(body, LengthBody) else 0) == length


def test_a_transfer_coding_chooses_the_decoder_of_each_leg() -> None:
    chunked = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked")
    assert isinstance(body_decoder(chunked, "GET"), ChunkedBody)
    other = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip")
    assert isinstance(body_decoder(other, "GET"), CloseBody)
    head = parse_request_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked")
    with pytest.raises(BadRequest) as info:
        request_body_decoder(head)
    assert info.value.status == 501


@pytest.mark.parametrize(
    ("raw", "method", "kind"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", "POST", ChunkedBody),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked", "POST", ChunkedBody),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, deflate, chunked", "POST", ChunkedBody),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip", "POST", CloseBody),
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
    """The error says what the engine declared (the relay reports it with the 502)."""
    with pytest.raises(ProtocolError) as info:
        body_decoder(parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: " + length), "GET")
    declared = sorted(v.strip() for v in length.decode().split(","))
    assert str(info.value) == f"invalid Content-Length: {declared!r}"


def test_an_engines_chunked_body_remembers_its_reads_in_the_pools_frames() -> None:
    """The frames given are the ones the decoder fills: every connection of an upstream pool
    shares what one learnt of the engine's one-chunk reads."""
    frames: Frames = {}
    head = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")
    decoder = body_decoder(head, "POST", frames)
    assert decoder.feed(b"5\r\nhello\r\n") == b"hello"
    assert frames == {10: (3, b"5\r\n")}
    again = body_decoder(head, "POST", frames)
    assert again.feed(b"5\r\nworld\r\n") == b"world"


def decoder_for(*fields: bytes) -> object:
    return request_body_decoder(parse_request_head(b"\r\n".join([b"POST / HTTP/1.1", *fields])))


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
        ([b"Transfer-Encoding: gzip, deflate, chunked"], 501),
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


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([b"Content-Length: 5", b"Transfer-Encoding: chunked"],
         "both Transfer-Encoding and Content-Length"),
        ([b"Transfer-Encoding: chunked, gzip"], "chunked is not the final transfer coding"),
        ([b"Transfer-Encoding: gzip, chunked"], "transfer coding not implemented"),
        ([b"Content-Length: 5, 6"], "invalid Content-Length"),
    ],
)  # fmt: skip
def test_a_refused_request_body_says_why(fields: list[bytes], message: str) -> None:
    """The message is what the client reads in the 400 or 501 body (``llmobs: ...``)."""
    with pytest.raises(BadRequest) as info:
        decoder_for(*fields)
    assert str(info.value) == message


def test_a_clients_chunked_body_is_read_strictly_an_engines_leniently() -> None:
    """A chunk line ended by a bare LF: a front proxy may read such a body otherwise, so a
    client's is refused (smuggling); an engine's is read as it is meant."""
    body = b"5\nhello\n0\n\n"
    client = decoder_for(b"Transfer-Encoding: chunked")
    assert isinstance(client, ChunkedBody)
    with pytest.raises(ProtocolError, match="CRLF"):
        client.feed(body)
    head = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")
    engine = body_decoder(head, "POST")
    assert engine.feed(body) == b"hello"
    assert engine.done


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


def test_the_longest_length_is_read_on_either_path() -> None:
    """A length of exactly 18 digits is valid, as one line (the fast path) or repeated in a
    list (the general path), and 19 digits are refused on both."""
    longest, longer = "9" * 18, "1" + "0" * 18
    assert declared_length([longest]) == declared_length([f"{longest}, {longest}"]) == int(longest)
    for lengths in ([longer], [f"{longer}, {longer}"]):
        with pytest.raises(ValueError, match="invalid Content-Length"):
            declared_length(lengths)
