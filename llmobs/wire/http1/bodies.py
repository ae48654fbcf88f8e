"""HTTP/1.1 bodies, sans I/O: decoders that take a body's reads and give their payload.

A decoder's ``feed`` returns the payload a read carried as one ``bytes`` (the observer times
reads, and an SSE event split over chunks is the framing layer's business), and sets ``done``
at the end of the body; bytes after it are kept in ``extra`` (a response's make the connection
unfit for reuse; a request's are the next pipelined request). Property-tested under every
chunking (tests/unit/wire/http1/test_bodies.py).
"""

from __future__ import annotations

import re
from enum import IntEnum

from llmobs.wire.http1.errors import ProtocolError

MAX_CHUNK_LINE = 4096  # a chunk-size line with extensions
_HEX = b"0123456789abcdefABCDEF"  # tested as ``x.lstrip(_HEX)`` (see heads.TOKEN)


class BodyDecoder:
    """Base of the body decoders: ``feed`` a read, get its payload.

    ``whole`` says that the last read was exactly whole chunks of a chunked body (the last
    chunk included when ``done``, then with no trailer): the read itself is then a valid
    ``chunked`` framing of its payload, and a relay whose client side is chunked too can
    write it on as it came, with no re-framing (``relay.response``).

    ``backlog`` says that ``feed`` stopped before the end of its read, having done its share
    of work (``FEED_BUDGET``): the caller lets other connections run, then takes the rest with
    ``resume`` (the I/O layers pause reading meanwhile). Only framing that costs work per
    chunk ever stops early; a length-delimited body never does.
    """

    __slots__ = ("backlog", "done", "extra", "whole")

    def __init__(self) -> None:
        self.done = False
        self.extra = b""  # bytes after the end of the body
        self.whole = False
        self.backlog = False

    def feed(self, data: bytes) -> bytes:
        raise NotImplementedError

    def resume(self) -> bytes:
        """The payload of more of the read that ``feed`` left (``backlog``)."""
        return b""

    def pending(self) -> int:
        """Bytes of the last read not decoded yet (``backlog``)."""
        return 0

    def eof(self) -> bool:
        """The connection closed: True if that ends the body cleanly."""
        return self.done


class NoBody(BodyDecoder):
    """HEAD responses, 204, 304: done before any byte."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self.done = True

    def feed(self, data: bytes) -> bytes:
        self.extra += data
        return b""


class LengthBody(BodyDecoder):
    """A body of ``Content-Length`` bytes."""

    __slots__ = ("length", "remaining")

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length  # as declared
        self.remaining = length
        self.done = length == 0

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.extra += data
            return b""
        n = self.remaining
        if len(data) < n:
            self.remaining = n - len(data)
            return data
        self.remaining = 0
        self.done = True
        if len(data) > n:
            self.extra = data[n:]
            return data[:n]
        return data


class CloseBody(BodyDecoder):
    """No length, not chunked: the body runs until the upstream closes the connection."""

    __slots__ = ()

    def feed(self, data: bytes) -> bytes:
        return data

    def eof(self) -> bool:
        self.done = True
        return True


class ChunkState(IntEnum):
    """Where a chunked body's decoder stands between reads."""

    SIZE = 0  # at a size line
    DATA = 1  # inside a chunk's data
    DATA_END = 2  # at the CRLF after a chunk's data
    TRAILER = 3  # in the trailer section, after the last chunk


_SIZE, _DATA, _DATA_END, _TRAILER = ChunkState
# Read length -> (the length of its size line with CRLF, that line), of reads that were
# exactly one chunk: what ``ChunkedBody`` remembers, for at most _FRAMES lengths (token events
# take a few dozen; when full it starts again, so that the lengths of other bodies cannot keep
# the tokens' out for good). Pure: any chunked bodies may share one (the upstream pool's all
# do). Plain ints, not slice objects: a slice built in place comes from the interpreter's
# one-slice cache, where a stored one is an object more to fetch on every read.
Frames = dict[int, tuple[int, bytes]]
_FRAMES = 256

# The work one ``feed`` (or ``resume``) does at most: lines of framing (size lines, trailer
# fields), a long line counting once per 64 bytes (the strict grammar's regex runs over it).
# Chunk data costs a copy, not a step per byte, and is not counted. A read of more framing
# than this (a body of 1-byte chunks) is decoded over several turns of the event loop, so
# that one connection cannot hold up the streams of all the others.
FEED_BUDGET = 256
MAX_TRAILER_BYTES = 16 * 1024  # a chunked body's trailer section (then FieldsTooLarge)

# RFC 9112 section 7.1: chunk-size [ chunk-ext ], nothing else (what a strict parser takes)
_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QDTEXT = rb"[^\"\\\x00-\x08\x0a-\x1f\x7f]"  # a quoted string's text, and what \ may quote
_QUOTED = rb'"(?:' + _QDTEXT + rb"|\\(?:" + _QDTEXT + rb'|["\\]))*"'
_STRICT_SIZE_LINE = re.compile(
    rb"[0-9A-Fa-f]{1,16}"
    + rb"(?:[ \t]*;[ \t]*" + _TCHAR + rb"(?:[ \t]*=[ \t]*(?:" + _TCHAR + rb"|" + _QUOTED + rb"))?)*"
)  # fmt: skip


class FieldsTooLarge(ProtocolError):
    """A chunked body's trailer section passed ``MAX_TRAILER_BYTES`` (a client gets 431)."""


class ChunkedBody(BodyDecoder):
    """``Transfer-Encoding: chunked``; chunk extensions ignored, trailers dropped.

    The common case, a read that holds exactly one whole chunk (how engines write a token),
    takes one ``find`` and one slice. Once a read of some length was one chunk, a later read
    of that length is one chunk if it starts with the same size line and ends in CRLF
    (``_frames``): two slices compared, two calls fewer than ``find`` and ``endswith``, which
    parse their arguments by format string. Other reads alternate between ``_scan``, a loop of
    ``find`` and slices over plainly framed whole chunks (a busy engine's coalesced reads, a
    client's upload), and a line state machine for the rest (a chunk cut by the read, an
    extension, the trailer), within ``FEED_BUDGET`` (``backlog``).

    Why our own: httptools (llhttp) decodes 1-byte chunks many times faster (docs/benchmarks.md,
    "Hostile parties"), but tells no
    offset where a body ends (the bytes after it are the next pipelined request), sets no
    bound on a chunk extension or a trailer section, and calls back per chunk without a way
    to stop part way through a read; the budget bounds what ours costs per turn instead.
    """

    __slots__ = (
        "_frames",
        "_line",
        "_plain",
        "_remaining",
        "_rest",
        "_rest_at",
        "_state",
        "_strict",
        "_trailer",
    )

    def __init__(self, strict: bool = False, frames: Frames | None = None) -> None:
        super().__init__()
        # A client's body is read strictly (lines end in CRLF, a size line is RFC 9112's
        # grammar): a front proxy that reads a lenient form differently would disagree with
        # the sidecar on where the request ends (smuggling). An engine's is read leniently.
        self._strict = strict
        self._state = _SIZE
        self._line = b""  # a size or trailer line split across reads
        self._remaining = 0  # payload bytes left in the current chunk
        self._plain = True  # this read: no chunk extension, no trailer field
        self._frames = {} if frames is None else frames
        self._trailer = 0  # bytes of trailer section so far
        self._rest = b""  # the read that ``feed`` left part of (``backlog``) ...
        self._rest_at = 0  # ... and where it stopped

    def feed(self, data: bytes) -> bytes:
        if self.done or self.backlog:
            return self._late(data)
        if self._state == _SIZE and not self._line:
            frame = self._frames.get(len(data))
            if frame is not None:
                at, line = frame
                if data[:at] == line and data[-2:] == b"\r\n":
                    self.whole = True
                    return data[at:-2]  # exactly one chunk, of a length seen before
            end = data.find(b"\r\n")
            line = data[:end]
            if 0 < end <= 16 and not line.lstrip(_HEX):
                size = int(line, 16)
                stop = end + 2 + size
                if len(data) == stop + 2 and data.endswith(b"\r\n"):
                    self.whole = True
                    if not size:  # the last chunk alone, with no trailer
                        self._state, self.done = _TRAILER, True
                        return b""
                    return self._remember(data, end + 2, stop)  # exactly one chunk
            out: list[bytes] = []
            pos, budget = _scan(data, 0, out, FEED_BUDGET)
            n = len(data)
            if pos == n or (pos == n - 5 and data.endswith(b"0\r\n\r\n")):
                # whole chunks, and perhaps the last (no trailer): a busy engine's reads
                self.whole = True
                if pos != n:
                    self._state, self.done = _TRAILER, True
                return out[0] if len(out) == 1 else b"".join(out)
            return self._decode(data, pos, out, budget, True)
        return self._decode(data, 0, [], FEED_BUDGET, False)

    def _late(self, data: bytes) -> bytes:
        """A read after the end of the body (kept in ``extra``), or while ``feed`` left part
        of the last one (the caller must ``resume`` first: the bytes are kept in order)."""
        if self.done:
            self.extra += data
            self.whole = False
            return b""
        self._rest = self._rest[self._rest_at :] + data
        self._rest_at = 0
        return self.resume()

    def _remember(self, data: bytes, at: int, stop: int) -> bytes:
        """A read of exactly one chunk, of a length not seen as one before: its size line is
        remembered (``_frames``), so that the next read of that length takes two slices;
        returns its payload, ``data[at:stop]``."""
        if len(self._frames) >= _FRAMES:
            self._frames.clear()
        self._frames[len(data)] = (at, data[:at])
        return data[at:stop]

    def resume(self) -> bytes:
        if not self.backlog:
            return b""
        data, at = self._rest, self._rest_at
        self._rest, self.backlog = b"", False
        return self._decode(data, at, [], FEED_BUDGET, False)

    def pending(self) -> int:
        return len(self._rest) - self._rest_at if self.backlog else 0

    def _decode(self, data: bytes, pos: int, out: list[bytes], budget: int, plain: bool) -> bytes:
        """The line state machine, with ``_scan`` at each chunk's start, from ``pos`` on;
        ``plain``: the read began at a chunk, so it may turn out whole."""
        n = len(data)
        # whole chunks only: the read starts at a chunk's size line ...
        self._plain = plain
        while pos < n and not self.done:
            if budget <= 0:  # its share done: the rest waits for ``resume``
                self._rest, self._rest_at, self.backlog = data, pos, True
                self._plain = False
                break
            if self._state == _SIZE and not self._line:
                scanned, budget = _scan(data, pos, out, budget)
                if data.startswith(b"0\r\n\r\n", scanned):  # the last chunk, no trailer
                    pos, self._state, self.done = scanned + 5, _TRAILER, True
                    break
                if scanned != pos:
                    pos = scanned
                    continue
            if self._state == _DATA:
                take = min(self._remaining, n - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
                continue
            end = data.find(b"\n", pos)
            if end < 0:
                self._line += data[pos:]
                self._check_line(len(self._line))
                break
            line = self._line + data[pos:end]
            self._check_line(len(line))
            budget -= 1 + (len(line) >> 6)
            pos = end + 1
            self._line = b""
            self._step(line)
        if pos < n and self.done:
            self.extra = data[pos:]
        # ... and ends at one, or at the end of the body with nothing after it
        self.whole = self._plain and (
            (self._state == _SIZE and not self._line) if not self.done else not self.extra
        )
        return out[0] if len(out) == 1 else b"".join(out)

    def _check_line(self, length: int) -> None:
        """Every line is bounded, whole in one read or not; the trailer section as well."""
        if self._state == _TRAILER:
            if self._trailer + length > MAX_TRAILER_BYTES:
                raise FieldsTooLarge("trailer section too large")
        elif length > MAX_CHUNK_LINE:
            raise ProtocolError("chunk line too long")

    def _step(self, line: bytes) -> None:
        """One line of framing (with its LF, without): a size line, the CRLF after a
        chunk's data, or a line of the trailer section."""
        if line[-1:] != b"\r" or line[-2:-1] == b"\r":
            self._plain = False  # not one CRLF (a bare LF, CR CR LF): re-framed, not relayed
            if self._strict:
                raise ProtocolError("a chunk line not ended by one CRLF")
        line = line.rstrip(b"\r")
        state = self._state
        if state == _DATA_END:
            if line:
                raise ProtocolError("chunk data not followed by CRLF")
            self._state = _SIZE
        elif state == _SIZE:
            size = self._size(line)
            if size:
                self._state, self._remaining = _DATA, size
            else:
                self._state = _TRAILER
        elif not line:  # _TRAILER: the blank line ends the body
            self.done = True
        else:
            self._trailer += len(line) + 2
            self._plain = False  # a trailer field: dropped, so not relayed as it came

    def _size(self, line: bytes) -> int:
        if line.lstrip(_HEX):  # not bare hex digits: an extension, or spaces
            self._plain = False
            if self._strict and _STRICT_SIZE_LINE.fullmatch(line) is None:
                raise ProtocolError(f"bad chunk size line: {line[:64]!r}")
            line = line.split(b";", 1)[0].strip()
            if line.lstrip(_HEX):
                raise ProtocolError(f"bad chunk size line: {line[:64]!r}")
        if not line or len(line) > 16:
            raise ProtocolError(f"bad chunk size line: {line[:64]!r}")
        return int(line, 16)


def _scan(data: bytes, pos: int, out: list[bytes], budget: int) -> tuple[int, int]:
    """Whole, plainly framed chunks from ``pos`` on (bare hex sizes, CRLFs, data present in
    full), their payloads appended to ``out``; returns where it stopped and the budget left.
    It stops, with nothing taken of it, at anything else: the last chunk, an extension, a
    chunk the read cut short or a broken one, which the line state machine then decides.
    A loop of ``find`` and slices per chunk: a state change per line costs several times
    more, and a body of tiny chunks is all lines."""
    find = data.find
    append = out.append
    while budget > 0:
        end = find(b"\r\n", pos, pos + 18)
        if end <= pos:  # no size line of 1-16 characters here
            break
        line = data[pos:end]
        if line.lstrip(_HEX):
            break
        size = int(line, 16)
        stop = end + 2 + size
        if not size or data[stop : stop + 2] != b"\r\n":
            break
        append(data[end + 2 : stop])
        pos = stop + 2
        budget -= 1
    return pos, budget
