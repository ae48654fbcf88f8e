"""gRPC through the relay: what makes a request gRPC's, and how the relay answers one itself.

gRPC is HTTP/2 with length-prefixed messages and its status in trailers (the protocol's
"PROTOCOL-HTTP2.md"). The relay forwards it as any request, with three differences: it goes
to the engine over HTTP/2 whatever ``--upstream-http2`` says (``Relay.grpc_pool``); its body
streams both ways (a client or bidirectional stream: Triton's ``ModelStreamInfer``), so it is
sent once its first message has come, the rest following as the client sends it; and an
error of the sidecar's own is a gRPC status, not an HTTP one (``grpc_error``).
"""

from __future__ import annotations

from urllib.parse import quote

PREFIX = 5  # a message's prefix: its compressed flag, then its length (4 bytes, big-endian)
FIRST_LIMIT = 1 << 20  # a first message the relay waits for whole before it sends the request

# gRPC's codes (grpc/doc/statuscodes.md) for the HTTP statuses the sidecar answers with, as
# its HTTP-to-gRPC mapping (doc/http-grpc-status-mapping.md) reads them
_CODES = {400: 13, 401: 16, 403: 7, 404: 12, 408: 4, 413: 8, 429: 14, 502: 14, 503: 14, 504: 4}
UNKNOWN_CODE = 2


def is_grpc(content_type: str) -> bool:
    """Whether a Content-Type is gRPC's (``application/grpc``, ``+proto`` and the like; not
    gRPC-Web, which is plain HTTP with its trailers in the body)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/grpc" or media.startswith("application/grpc+")


def first_message(prefix: bytes, received: int) -> bool:
    """Whether the request may go, from its body's first bytes and how many have come: its
    first message is whole (its ``prefix`` says how long), or declares more than
    ``FIRST_LIMIT``, which is not waited for (it streams on; the engine's own limit refuses
    it, or takes it)."""
    if len(prefix) < PREFIX:
        return False
    length = int.from_bytes(prefix[1:PREFIX], "big")
    return length > FIRST_LIMIT or received >= PREFIX + length


def grpc_code(status: int) -> int:
    """The gRPC code a client would read for the sidecar's own HTTP ``status``."""
    return _CODES.get(status, UNKNOWN_CODE)


def grpc_status(status: int, message: str) -> list[tuple[str, str]]:
    """The trailers that end a call with the sidecar's own error: the code a client would
    read for HTTP ``status``, and its message (percent-encoded, as the spec says)."""
    return [
        ("grpc-status", str(grpc_code(status))),
        ("grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")),
    ]


def grpc_error(status: int, message: str) -> list[tuple[str, str]]:
    """A "trailers-only" answer's header fields for an error the sidecar answers itself: HTTP
    200, gRPC's content type, then ``grpc_status``'s."""
    return [("content-type", "application/grpc"), *grpc_status(status, message)]
