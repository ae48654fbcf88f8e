"""HTTP/1.1 sans I/O, for both legs of the relay (h11's split: no clock, no sockets).

The relay speaks HTTP at the protocol level on both sides (``server`` to clients, ``upstream``
to the engine) so that each network read is handled inside ``data_received``, with no task
switch per chunk and no framework objects per request. These are the pure parts, all
property-tested under every chunking:

- ``heads``: request and response heads from bytes, strict where parsers could disagree;
- ``bodies``: body decoders (chunked, length, until close, none), a read in, its payload out;
- ``policy``: pure functions for which body a message has, how it is framed, whether a
  connection may be kept, when ``100 Continue`` is due;
- ``errors``: ``ProtocolError`` (the peer is not speaking HTTP/1.x) and ``BadRequest``.

The names most callers need are here too.
"""

from llmobs.wire.http1.bodies import (
    FEED_BUDGET,
    MAX_CHUNK_LINE,
    MAX_TRAILER_BYTES,
    BodyDecoder,
    ChunkedBody,
    ChunkState,
    CloseBody,
    FieldsTooLarge,
    Frames,
    LengthBody,
    NoBody,
)
from llmobs.wire.http1.errors import BadRequest, ProtocolError
from llmobs.wire.http1.heads import (
    MAX_HEAD_BYTES,
    MAX_REQUEST_HEAD_BYTES,
    MAX_REQUEST_HEADERS,
    RequestHead,
    ResponseHead,
    climbs_above_root,
    parse_request_head,
    parse_response_head,
)
from llmobs.wire.http1.policy import (
    ResponseFraming,
    body_decoder,
    content_length,
    declared_length,
    expects_continue,
    keep_alive,
    request_body_decoder,
    request_keep_alive,
    response_framing,
    response_has_body,
    reusable,
)

__all__ = [
    "FEED_BUDGET",
    "MAX_CHUNK_LINE",
    "MAX_HEAD_BYTES",
    "MAX_REQUEST_HEADERS",
    "MAX_REQUEST_HEAD_BYTES",
    "MAX_TRAILER_BYTES",
    "BadRequest",
    "BodyDecoder",
    "ChunkState",
    "ChunkedBody",
    "CloseBody",
    "FieldsTooLarge",
    "Frames",
    "LengthBody",
    "NoBody",
    "ProtocolError",
    "RequestHead",
    "ResponseFraming",
    "ResponseHead",
    "body_decoder",
    "climbs_above_root",
    "content_length",
    "declared_length",
    "expects_continue",
    "keep_alive",
    "parse_request_head",
    "parse_response_head",
    "request_body_decoder",
    "request_keep_alive",
    "response_framing",
    "response_has_body",
    "reusable",
]
