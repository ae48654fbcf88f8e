"""WebSocket framing (RFC 6455 section 5), read as it passes through a tunnel: where each
frame begins and ends, the limit on a message's size, and the messages, for observation.

Why not wsproto: it is an endpoint, raising on a protocol error where a relay must pass the
bytes on and step aside, and its permessage-deflate (RFC 7692) inflates a message whole with
no bound, where one small frame can inflate a thousandfold. This reader bounds both the
bytes on the wire and the inflation by the limit, and keeps at most ``keep`` bytes of a
message for observation (counting the rest). A reader never changes a byte: the tunnel
passes what it read on, up to where ``feed`` says a message went over the limit.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

OP_CONTINUATION, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA
_DATA = frozenset({OP_TEXT, OP_BINARY})
_CONTROL = frozenset({OP_CLOSE, OP_PING, OP_PONG})
_FIN, _RSV1, _RSVS = 0x80, 0x40, 0x30
_MAX_HEADER = 14  # two bytes, an eight-byte length, a four-byte mask
_TAIL = b"\x00\x00\xff\xff"  # what RFC 7692 7.2.2 has the receiver append to a message

# Close codes (RFC 6455 7.4.1) the sidecar itself sends when it ends a session
GOING_AWAY = 1001  # idle past the limit, or the sidecar shuts down
TOO_BIG = 1009  # a message over the limit
NORMAL_CODES = frozenset({1000, 1001, 1005})  # a clean close (1005: no code given)


class Message(NamedTuple):
    """A whole message, or a control frame: its opcode, its payload (unmasked, inflated;
    None when it was over the reader's ``keep`` and not kept) and its size in bytes."""

    opcode: int
    payload: bytes | None
    size: int


class BrokenFraming(Exception):
    """Bytes that are not WebSocket frames: the reader stops; the bytes still pass."""


class FrameReader:
    """One direction of a WebSocket: frames parsed as they pass, ``messages`` as they end.

    ``limit``: the largest message (its payload, inflated), beyond which ``feed`` stops
    passing bytes; ``keep``: the largest message whose payload is kept for observation;
    ``deflate``: permessage-deflate was negotiated (the 101's ``Sec-WebSocket-Extensions``).
    One inflater serves every message: a context kept by the sender needs it, and one reset
    by the sender (``no_context_takeover``) reads the same through it; 15 window bits read
    any smaller window.
    """

    __slots__ = (
        "_compressed",
        "_control",
        "_head",
        "_inflater",
        "_keep",
        "_kept",
        "_left",
        "_mask",
        "_message",
        "_opcode",
        "_parts",
        "_size",
        "_wire",
        "broken",
        "clean",
        "limit",
        "messages",
    )

    def __init__(self, limit: int, keep: int, deflate: bool = False) -> None:
        self.limit = limit
        self._keep = keep
        self._inflater = zlib.decompressobj(-15) if deflate else None
        self._head = b""  # a frame header begun in an earlier read
        self._left = 0  # payload bytes of the frame being read still to come
        self._mask = b""  # its mask, rotated to the next payload byte
        self._opcode = 0  # the frame's opcode
        self._control = b""  # a control frame's payload so far (at most 125 bytes)
        self._message = -1  # the data message being read: its opcode (-1: none)
        self._compressed = False
        self._parts: list[bytes] = []  # its payload so far, while kept
        self._kept = True
        self._size = 0  # its size so far (inflated)
        self._wire = 0  # ... and as sent (compressed): both are held to the limit
        self.messages: list[Message] = []  # ended since the owner last took them
        self.broken = False  # not frames: no longer read (the peer will fail it)
        self.clean = True  # ``feed`` stopped at a frame's start: a close frame may follow

    @property
    def between(self) -> bool:
        """No frame part way through: a frame written now starts where a frame may."""
        return not self._left and not self._head and not self.broken

    def feed(self, data: bytes) -> int:
        """Read ``data``: returns how many of its bytes may pass, all of them unless a
        message goes over the limit (then the bytes before it; ``clean`` says whether that
        is a frame's start)."""
        if self.broken:
            return len(data)
        try:
            return self._feed(data)
        except BrokenFraming:
            self.broken = True
            self._parts.clear()
            return len(data)

    def _feed(self, data: bytes) -> int:
        at, end = 0, len(data)
        while at < end:
            if self._left:
                take = min(self._left, end - at)
                self._left -= take
                if not self._payload(data[at : at + take]):
                    self.clean = False
                    return at  # inflated past the limit: cut here
                at += take
                if not self._left:
                    self._frame_end()
                continue
            begun = len(self._head)
            header = self._head + data[at : at + _MAX_HEADER]
            parsed = _header(header)
            if parsed is None:
                self._head = header
                return end
            first, length, mask, size = parsed
            self._head = b""
            if not self._begin(first, length):
                self.clean = not begun  # (a header begun earlier: at is 0, its start passed)
                return at
            at += size - begun
            self._mask = mask
            self._left = length
            if not length:
                self._frame_end()
        return end

    def _begin(self, first: int, length: int) -> bool:
        """A frame's header: whether its message stays within the limit."""
        opcode = first & 0x0F
        if first & _RSVS:
            raise BrokenFraming("reserved bits set")
        self._opcode = opcode
        if opcode in _CONTROL:
            if length > 125 or not first & _FIN or first & _RSV1:
                raise BrokenFraming("bad control frame")
            return True
        if opcode in _DATA:
            if self._message >= 0:
                raise BrokenFraming("a data frame inside a message")
            self._message = opcode
            self._compressed = bool(first & _RSV1)
            if self._compressed and self._inflater is None:
                raise BrokenFraming("compressed without permessage-deflate")
        elif opcode != OP_CONTINUATION or self._message < 0:
            raise BrokenFraming("unknown opcode, or a continuation of nothing")
        elif first & _RSV1:
            raise BrokenFraming("RSV1 on a continuation")
        self._opcode = opcode | (0x80 if first & _FIN else 0)
        self._wire += length
        return self._wire <= self.limit

    def _payload(self, chunk: bytes) -> bool:
        """Payload bytes of the frame being read: whether the message is within the limit."""
        opcode = self._opcode & 0x0F
        if opcode in _CONTROL:
            self._control += _unmask(chunk, self._mask)
            self._mask = _rotate(self._mask, len(chunk))
            return True
        if self._compressed:
            return self._inflate(_unmask(chunk, self._mask), chunk)
        self._size += len(chunk)
        self._hold(chunk)
        return True

    def _inflate(self, plain: bytes, chunk: bytes) -> bool:
        """A compressed message's bytes: inflated at most to the limit (a bomb's bytes
        beyond it are never made)."""
        self._mask = _rotate(self._mask, len(chunk))
        inflater = self._inflater
        assert inflater is not None
        room = self.limit - self._size + 1
        out = inflater.decompress(plain, room)
        self._size += len(out)
        if inflater.unconsumed_tail or self._size > self.limit:
            return False
        if self._kept:
            self._keep_part(out)
        return True

    def _hold(self, chunk: bytes) -> None:
        """An uncompressed payload's bytes, unmasked only while the message is kept."""
        if self._kept and self._size <= self._keep:
            self._parts.append(_unmask(chunk, self._mask))
        else:
            self._kept = False
            self._parts.clear()
        self._mask = _rotate(self._mask, len(chunk))

    def _keep_part(self, out: bytes) -> None:
        if self._size <= self._keep:
            self._parts.append(out)
        else:
            self._kept = False
            self._parts.clear()

    def _frame_end(self) -> None:
        """A frame ended: a control frame is a message of its own; a data frame with FIN set
        ends its message."""
        opcode = self._opcode
        if (opcode & 0x0F) in _CONTROL:
            control, self._control = self._control, b""
            self.messages.append(Message(opcode & 0x0F, control, len(control)))
            return
        if not opcode & 0x80:
            return
        if self._compressed and not self._inflate(_TAIL, b""):
            self._kept = False
        payload = b"".join(self._parts) if self._kept else None
        self.messages.append(Message(self._message, payload, self._size))
        self._message, self._compressed, self._kept = -1, False, True
        self._size = self._wire = 0
        self._parts = []


def _header(buf: bytes) -> tuple[int, int, bytes, int] | None:
    """A frame header at the start of ``buf``: its first byte, payload length, mask and
    size; None if it is not all there yet."""
    if len(buf) < 2:
        return None
    first, second = buf[0], buf[1]
    length, at = second & 0x7F, 2
    if length == 126:
        if len(buf) < 4:
            return None
        length, at = int.from_bytes(buf[2:4], "big"), 4
    elif length == 127:
        if len(buf) < 10:
            return None
        length, at = int.from_bytes(buf[2:10], "big"), 10
        if length >> 63:
            raise BrokenFraming("a length with its top bit set")
    mask = b""
    if second & 0x80:
        if len(buf) < at + 4:
            return None
        mask, at = buf[at : at + 4], at + 4
    return first, length, mask, at


def _unmask(data: bytes, mask: bytes) -> bytes:
    """``data`` XOR the repeated ``mask`` (none: as it is), in one big-integer operation."""
    if not mask or not data:
        return data
    n = len(data)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def _rotate(mask: bytes, n: int) -> bytes:
    """The mask as it stands ``n`` payload bytes further on."""
    if not mask:
        return mask
    k = n % 4
    return mask[k:] + mask[:k]


def close_frame(code: int, reason: str, masked: bool) -> bytes:
    """A close frame with ``code`` and ``reason`` (short, ASCII): unmasked as a server sends
    it to a client, or masked (with a zero key: the payload as it is) as a client sends it."""
    payload = code.to_bytes(2, "big") + reason.encode("ascii")[:123]
    if masked:
        return bytes((_FIN | OP_CLOSE, 0x80 | len(payload))) + b"\x00\x00\x00\x00" + payload
    return bytes((_FIN | OP_CLOSE, len(payload))) + payload


def close_code(payload: bytes | None) -> int:
    """The code of a close frame's payload (1005: none given)."""
    if payload is None or len(payload) < 2:
        return 1005
    return int.from_bytes(payload[:2], "big")


def deflated(extensions: str) -> bool:
    """Whether a 101's ``Sec-WebSocket-Extensions`` accepted permessage-deflate."""
    return any(
        part.split(";", 1)[0].strip().lower() == "permessage-deflate"
        for part in extensions.split(",")
    )
