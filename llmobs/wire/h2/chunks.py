"""The relay's whole HTTP/1.1 chunks as HTTP/2 DATA: the payloads of ``size\\r\\ndata\\r\\n``.

The relay writes an engine's chunked body as it came, whole chunks at a time (its hot path on
HTTP/1.1 is one ``transport.write`` of them); a stream over HTTP/2 carries the payloads alone,
so they are cut out here. Pure, and strict: the chunks were framed by the engine and checked by
the engine leg's decoder, so anything else is the relay's bug (a ``ValueError``).
"""

from __future__ import annotations

_HEX = b"0123456789abcdefABCDEF"


def payloads(chunks: bytes) -> tuple[list[bytes], bool]:
    """The payloads of the whole chunks in ``chunks``, and whether the last chunk (size 0,
    then any trailer) was among them."""
    out: list[bytes] = []
    at, end = 0, len(chunks)
    while at < end:
        eol = chunks.find(b"\r\n", at)
        line = chunks[at:eol].split(b";", 1)[0].strip()
        if eol < 0 or not line or line.lstrip(_HEX):
            raise ValueError("a chunk's size line is not hexadecimal digits")
        size = int(line, 16)
        if size == 0:
            return out, True
        start = eol + 2
        stop = start + size
        if chunks[stop : stop + 2] != b"\r\n":
            raise ValueError("a chunk's data does not end with CRLF")
        out.append(chunks[start:stop])
        at = stop + 2
    return out, False
