"""A stream's header block as the request head HTTP/1.1's parser gives (``http1.RequestHead``),
refused where HTTP/1.1 would refuse it, so that the relay handles both alike.

The ``h2`` state machine has checked the block already (RFC 9113 8.2 and 8.3: lowercase names,
no connection-specific field, pseudo-headers first and once); here are the relay's own rules:
no CONNECT (405), a target in origin form that does not climb above the root (400), the field
count's limit (431), and ``:authority`` as ``Host``.
"""

from __future__ import annotations

from multidict import CIMultiDict

from llmobs.wire.http1 import BadRequest, RequestHead
from llmobs.wire.http1.heads import MAX_REQUEST_HEADERS, origin_form

VERSION = (2, 0)


def request_head(block: list[tuple[bytes, bytes]]) -> RequestHead:
    """The head of a stream's request from its header block (names and values as bytes)."""
    if len(block) > MAX_REQUEST_HEADERS + 4:  # (+ the four pseudo-headers)
        raise BadRequest(431, "too many header fields")
    pseudo: dict[bytes, bytes] = {}
    fields: list[tuple[str, str]] = []
    for name, value in block:
        if name[:1] == b":":
            pseudo[name] = value
        else:
            fields.append((name.decode("ascii"), value.decode("latin-1")))
    method = pseudo.get(b":method", b"")
    if method == b"CONNECT":  # a tunnel (RFC 9113 8.5): a reverse proxy has none to offer
        raise BadRequest(405, "CONNECT is not supported")
    path = pseudo.get(b":path", b"")
    if not method or not path:
        raise BadRequest(400, "a request without :method or :path")
    authority = pseudo.get(b":authority")
    if authority is not None:
        fields.insert(0, ("host", authority.decode("latin-1")))
    target = path.decode("latin-1") if path == b"*" else origin_form(path)
    return RequestHead(method.decode("ascii"), target, VERSION, CIMultiDict(fields), fields)
