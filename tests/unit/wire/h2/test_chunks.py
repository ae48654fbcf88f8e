"""The relay's whole chunks as DATA payloads (``h2.chunks``): every payload, in order, however
the engine framed them (extensions, a trailer), and the last chunk seen."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmobs.wire.h2.chunks import payloads


def _chunk(data: bytes, extension: bytes = b"") -> bytes:
    return b"%x%b\r\n%b\r\n" % (len(data), extension, data)


@given(
    st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    st.sampled_from([b"", b";name=value", b"; x"]),
    st.booleans(),
)
def test_every_payload_in_order_and_the_end(
    parts: list[bytes], extension: bytes, last: bool
) -> None:
    chunks = b"".join(_chunk(p, extension) for p in parts)
    if last:
        chunks += b"0\r\nX-Trailer: yes\r\n\r\n"
    assert payloads(chunks) == (parts, last)


def test_a_payload_holding_crlf_is_taken_by_its_size() -> None:
    assert payloads(_chunk(b"data: x\r\n\r\n") + b"0\r\n\r\n") == ([b"data: x\r\n\r\n"], True)


@pytest.mark.parametrize("broken", [b"5\r\nabc\r\n", b"zz\r\nab\r\n", b"3\r\nabcX\r\n"])
def test_what_is_not_whole_chunks_is_the_relays_bug(broken: bytes) -> None:
    with pytest.raises(ValueError, match="chunk's"):
        payloads(broken)
