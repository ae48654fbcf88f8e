"""gRPC's length-prefixed messages (``framing.GrpcDecoder``): split anywhere, over-long,
compressed, cut by the stream's end."""

from __future__ import annotations

import gzip
import zlib

from hypothesis import given
from hypothesis import strategies as st

from llmobs.observe.framing import GrpcDecoder


def frame(message: bytes, compressed: bool = False) -> bytes:
    return bytes([compressed]) + len(message).to_bytes(4, "big") + message


@given(
    st.lists(st.binary(max_size=40), min_size=1, max_size=8),
    st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=20),
)
def test_messages_split_across_reads_anywhere_come_out_whole(
    messages: list[bytes], cuts: list[int]
) -> None:
    wire = b"".join(frame(m) for m in messages)
    decoder = GrpcDecoder(1 << 20)
    got: list[bytes] = []
    pos = 0
    for cut in cuts * (len(wire) // max(1, sum(cuts)) + 1):
        got += decoder.payloads(wire[pos : pos + cut])
        pos += cut
        if pos >= len(wire):
            break
    got += decoder.payloads(wire[pos:])
    assert got == messages
    assert decoder.idle and decoder.flush_payloads() == [] and decoder.malformed == 0


def test_an_over_long_message_is_skipped_unheld_and_the_next_read() -> None:
    decoder = GrpcDecoder(8)
    big = frame(b"x" * 100)
    assert decoder.payloads(big[:20]) == []
    assert decoder.malformed == 1 and not decoder.idle
    # the rest of it passes without being kept, and the next message is whole again
    assert decoder.payloads(big[20:] + frame(b"ok")) == [b"ok"]
    assert decoder.idle and decoder.malformed == 1


def test_compressed_messages_are_inflated_for_known_encodings_only() -> None:
    text = b"token ids" * 3
    raw = zlib.compressobj(wbits=15)
    deflated = raw.compress(text) + raw.flush()
    assert GrpcDecoder(1024, "gzip").payloads(frame(gzip.compress(text), True)) == [text]
    assert GrpcDecoder(1024, "deflate").payloads(frame(deflated, True)) == [text]
    unknown = GrpcDecoder(1024, "snappy")
    assert unknown.payloads(frame(b"\x00\x01", True) + frame(b"plain")) == [b"plain"]
    assert unknown.malformed == 1
    broken = GrpcDecoder(1024, "gzip")
    assert broken.payloads(frame(b"not gzip", True)) == [] and broken.malformed == 1


def test_a_message_that_inflates_past_the_bound_is_not_kept() -> None:
    bomb = gzip.compress(b"\x00" * 100_000)
    decoder = GrpcDecoder(4096, "gzip")
    assert decoder.payloads(frame(bomb, True)) == []
    assert decoder.malformed == 1


def test_a_message_cut_by_the_streams_end_is_counted() -> None:
    decoder = GrpcDecoder(1024)
    assert decoder.payloads(frame(b"whole") + frame(b"cut short")[:7]) == [b"whole"]
    assert decoder.flush_payloads() == [] and decoder.malformed == 1
    clean = GrpcDecoder(1024)
    clean.payloads(frame(b""))  # an empty message is a message
    assert clean.flush_payloads() == [] and clean.malformed == 0
