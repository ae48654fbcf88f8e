"""HTTP/1.1 policy as pure functions, in the manner of h11's ``_keep_alive`` and
``_body_framing``: which body a message has and how it is framed, whether a connection may carry
another exchange, when ``100 Continue`` is due. No sockets: the server and the upstream
connection ask these, and the tests ask them directly (tests/unit/wire/http1/test_policy.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from multidict import CIMultiDict

from llmobs.wire.http1.bodies import (
    BodyDecoder,
    ChunkedBody,
    CloseBody,
    Frames,
    LengthBody,
    NoBody,
)
from llmobs.wire.http1.errors import BadRequest, ProtocolError
from llmobs.wire.http1.heads import RequestHead, ResponseHead

MAX_LENGTH_DIGITS = 18  # a Content-Length of more digits is no body anyone sends


class ResponseFraming(IntEnum):
    """How a response to the client is framed."""

    NONE = 0  # no body: HEAD, 1xx, 204, 304
    LENGTH = 1  # Content-Length
    CHUNKED = 2  # Transfer-Encoding: chunked (HTTP/1.1)
    CLOSE = 3  # until the connection closes (HTTP/1.0 without a length)


def keep_alive(version: tuple[int, int], headers: CIMultiDict[str]) -> bool:
    """Whether a message's sender lets the connection carry another exchange after it: by
    default from HTTP/1.1 on, unless ``Connection: close``; in HTTP/1.0 with ``keep-alive``."""
    values = headers.getall("Connection", ())
    if not values:
        return version >= (1, 1)
    tokens = {t.strip().lower() for v in values for t in v.split(",")}
    if version >= (1, 1):
        return "close" not in tokens
    return "keep-alive" in tokens


def request_keep_alive(head: RequestHead) -> bool:
    """Whether a client's connection may carry another request after this one (RFC 9112
    6.1: HTTP/1.0 with Transfer-Encoding has faulty framing, close after it)."""
    return keep_alive(head.version, head.headers) and not (
        head.version < (1, 1) and "Transfer-Encoding" in head.headers
    )


def expects_continue(head: RequestHead) -> bool:
    """Whether the client waits for ``100 Continue`` before it sends its body."""
    return head.version >= (1, 1) and head.headers.get("Expect", "").lower() == "100-continue"


def response_has_body(method: str, status: int) -> bool:
    """RFC 9112 6.3: a response to HEAD, a 1xx, a 204 and a 304 have none."""
    return not (method == "HEAD" or status in (204, 304) or 100 <= status < 200)


def declared_length(lengths: Sequence[str]) -> int:
    """The one length that ``Content-Length`` lines declare ("5, 5" is one); ValueError if
    they declare none that is valid, or two (a smuggling vector). One validator for both legs."""
    if len(lengths) == 1:  # the usual head: one plain number, checked as below
        value = lengths[0]
        if value.isdigit() and value.isascii() and len(value) <= MAX_LENGTH_DIGITS:
            return int(value)
    values = {v.strip() for line in lengths for v in line.split(",")}
    value = next(iter(values)) if len(values) == 1 else ""
    if not value.isascii() or not value.isdigit() or len(value) > MAX_LENGTH_DIGITS:
        raise ValueError(f"invalid Content-Length: {sorted(values)!r}")  # what was declared
    return int(value)  # (isdigit alone takes "²", which int refuses: hence isascii)


def content_length(headers: CIMultiDict[str]) -> int | None:
    """The ``Content-Length`` a head declares, if a valid one (else None: the body decoders
    are what refuses a bad one)."""
    lengths = headers.getall("Content-Length", ())
    if not lengths:
        return None
    try:
        return declared_length(lengths)
    except ValueError:
        return None


def response_framing(
    method: str, status: int, version: tuple[int, int], length: int | None
) -> ResponseFraming:
    """How a response of ``length`` bytes (None: unknown) is framed for a client that spoke
    ``version``."""
    if not response_has_body(method, status):
        return ResponseFraming.NONE
    if length is not None:
        return ResponseFraming.LENGTH
    return ResponseFraming.CHUNKED if version >= (1, 1) else ResponseFraming.CLOSE


def body_decoder(head: ResponseHead, method: str, frames: Frames | None = None) -> BodyDecoder:
    """The decoder RFC 9112 section 6.3 prescribes for this response; a chunked body
    remembers its one-chunk read lengths in ``frames`` (the upstream pool's, shared by
    all its connections) when given."""
    if not response_has_body(method, head.status):
        return NoBody()
    encoding = head.headers.get("Transfer-Encoding", "")
    if encoding:
        if encoding.replace(" ", "").lower().rsplit(",", 1)[-1] == "chunked":
            return ChunkedBody(frames=frames)
        return CloseBody()  # another final coding: read until close
    lengths = head.headers.getall("Content-Length", ())
    if lengths:
        try:
            return LengthBody(declared_length(lengths))
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
    return CloseBody()


def reusable(head: ResponseHead, decoder: BodyDecoder) -> bool:
    """Whether the connection to the engine may carry another request after this response:
    the engine keeps it alive and the body ends by its framing, not the close. Both framings at
    once (a transfer coding wins, RFC 9112 6.3) mean a confused engine or an attack under way:
    closed after this response."""
    headers = head.headers
    return (
        keep_alive(head.version, headers)
        and not isinstance(decoder, CloseBody)
        and not ("Transfer-Encoding" in headers and "Content-Length" in headers)
    )


def request_body_decoder(head: RequestHead) -> BodyDecoder | None:
    """The decoder of a request's body (RFC 9112 section 6.3); None when it has none.

    A request that carries both framings, or whose last transfer coding is not chunked, is
    refused with 400 (section 6.1: the usual smuggling vector), as are conflicting lengths;
    one with another coding before chunked gets 501 (section 6.1, not implemented).
    """
    headers = head.headers
    encoding = headers.get("Transfer-Encoding")
    lengths = headers.getall("Content-Length", ())
    if encoding is not None:
        if lengths:
            raise BadRequest(400, "both Transfer-Encoding and Content-Length")
        codings = ",".join(headers.getall("Transfer-Encoding")).replace(" ", "").lower()
        if codings.rsplit(",", 1)[-1] != "chunked":
            raise BadRequest(400, "chunked is not the final transfer coding")
        if codings != "chunked":
            raise BadRequest(501, "transfer coding not implemented")
        return ChunkedBody(strict=True)
    if not lengths:
        return None
    try:
        length = declared_length(lengths)
    except ValueError:
        raise BadRequest(400, "invalid Content-Length") from None
    return LengthBody(length) if length else None
