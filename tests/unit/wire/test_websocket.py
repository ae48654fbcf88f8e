"""The WebSocket frame reader against frames written by wsproto (a kept endpoint's framer):
messages whole, however the bytes are cut, masked or not, fragmented, compressed; the limit
on the wire and after inflation; broken framing passed through."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.extensions import Extension, PerMessageDeflate
from wsproto.frame_protocol import CloseReason, FrameProtocol, Opcode

from llmobs.wire.websocket import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_TEXT,
    FrameReader,
    close_code,
    close_frame,
    deflated,
)


def _writer(client: bool, deflate: bool = False) -> FrameProtocol:
    extensions: list[Extension] = []
    if deflate:
        ext = PerMessageDeflate()
        ext.finalize("permessage-deflate")
        extensions.append(ext)
    return FrameProtocol(client=client, extensions=extensions)


def _read(reader: FrameReader, data: bytes, cuts: list[int]) -> int:
    """Feed ``data`` cut at ``cuts``: the bytes passed in all."""
    passed, at = 0, 0
    for end in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if end < at:
            continue
        part = data[at:end]
        got = reader.feed(part)
        passed += got
        if got < len(part):
            return passed
        at = end
    return passed


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=6),
    st.lists(st.integers(0, 4000), max_size=8),
    st.booleans(),
    st.booleans(),
)
def test_messages_come_out_whole_however_the_bytes_are_cut(
    payloads: list[bytes], cuts: list[int], client: bool, deflate: bool
) -> None:
    writer = _writer(client, deflate)
    wire = b"".join(bytes(writer.send_data(p, fin=True)) for p in payloads)
    reader = FrameReader(1 << 20, 1 << 20, deflate)
    assert _read(reader, wire, cuts) == len(wire)
    assert [(m.opcode, m.payload, m.size) for m in reader.messages] == [
        (OP_BINARY, p, len(p)) for p in payloads
    ]
    assert reader.between


def test_fragments_with_a_ping_between_make_one_message() -> None:
    writer = _writer(client=True)
    hel, lo = writer.send_data("hel", fin=False), writer.send_data("lo", fin=True)
    parts = (hel, writer.ping(b"p"), lo)
    wire = b"".join(bytes(part) for part in parts)
    reader = FrameReader(1000, 1000)
    assert reader.feed(wire) == len(wire)
    assert [(m.opcode, m.payload) for m in reader.messages] == [
        (OP_PING, b"p"), (OP_TEXT, b"hello"),
    ]  # fmt: skip


def test_a_message_over_keep_is_counted_not_kept() -> None:
    wire = bytes(_writer(client=True).send_data(b"x" * 500, fin=True))
    reader = FrameReader(1000, 100)
    assert reader.feed(wire) == len(wire)
    (message,) = reader.messages
    assert message.payload is None and message.size == 500


def test_a_message_over_the_limit_stops_at_its_frame() -> None:
    writer = _writer(client=True)
    first = bytes(writer.send_data(b"ok", fin=True))
    wire = first + bytes(writer.send_data(b"y" * 2000, fin=True))
    reader = FrameReader(1000, 1000)
    assert reader.feed(wire) == len(first)
    assert reader.clean and reader.between
    assert [m.payload for m in reader.messages] == [b"ok"]


def test_fragments_are_held_to_the_limit_together() -> None:
    writer = _writer(client=False)
    head = bytes(writer.send_data(b"a" * 600, fin=False))
    wire = head + bytes(writer.send_data(b"b" * 600, fin=True))
    reader = FrameReader(1000, 1000)
    assert reader.feed(wire) == len(head)


def test_a_deflate_bomb_is_inflated_no_further_than_the_limit() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = compressor.compress(bytes(50_000_000)) + compressor.flush(zlib.Z_SYNC_FLUSH)
    body = body[:-4]  # RFC 7692: the tail is the receiver's to add
    assert len(body) < 100_000
    frame = bytes((0x80 | 0x40 | OP_BINARY, 126)) + len(body).to_bytes(2, "big") + body
    if len(body) > 0xFFFF:
        frame = bytes((0x80 | 0x40 | OP_BINARY, 127)) + len(body).to_bytes(8, "big") + body
    reader = FrameReader(1 << 20, 1024, deflate=True)
    assert reader.feed(frame) < len(frame)
    assert not reader.clean  # cut inside the frame: no close frame can follow cleanly


def test_a_header_cut_across_reads_over_the_limit_is_not_clean() -> None:
    wire = bytes(_writer(client=True).send_data(b"z" * 70_000, fin=True))
    reader = FrameReader(1000, 1000)
    assert reader.feed(wire[:3]) == 3
    assert reader.feed(wire[3:]) == 0
    assert not reader.clean


@pytest.mark.parametrize(
    "frame",
    [
        bytes((0x80 | 0x3, 0)),  # a reserved opcode
        bytes((0x80 | 0x20 | OP_TEXT, 0)),  # RSV2
        bytes((OP_PING, 0)),  # a fragmented control frame
        bytes((0x80 | OP_PING, 126)) + (200).to_bytes(2, "big") + bytes(200),  # too long
        bytes((0x80 | 0x0, 1, 0)),  # a continuation of nothing
        bytes((0x80 | 0x40 | OP_TEXT, 1, 0)),  # compressed, none negotiated
    ],
)
def test_broken_framing_passes_through_unread(frame: bytes) -> None:
    reader = FrameReader(1000, 1000)
    more = b"anything at all"
    assert reader.feed(frame) == len(frame)
    assert reader.feed(more) == len(more)
    assert reader.broken and not reader.messages


def test_close_frames_as_each_side_writes_them() -> None:
    for masked in (False, True):
        reader = FrameReader(1000, 1000)
        frame = close_frame(1009, "message too big", masked)
        assert reader.feed(frame) == len(frame)
        (message,) = reader.messages
        assert message.opcode == OP_CLOSE and close_code(message.payload) == 1009
    wsproto_close = bytes(_writer(client=True).close(CloseReason.NORMAL_CLOSURE))
    reader = FrameReader(1000, 1000)
    reader.feed(wsproto_close)
    assert close_code(reader.messages[0].payload) == 1000
    assert close_code(b"") == 1005
    assert Opcode.CLOSE == OP_CLOSE


def test_deflate_is_read_from_the_accepted_extensions() -> None:
    assert deflated("permessage-deflate; client_max_window_bits=15")
    assert deflated("x-other, Permessage-Deflate")
    assert not deflated("")
    assert not deflated("permessage-deflatex")
