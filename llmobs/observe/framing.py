"""Framing: bytes -> Server-Sent Events, incrementally and without I/O.

A sans-I/O decoder in the manner of httpx's LineDecoder and httpx-sse's SSEDecoder: the proxy
feeds it whatever chunks the network produced and gets back the events those bytes complete.
Any split of a stream into chunks yields the same events (a property test holds it to that).

It follows the WHATWG event-stream rules: ``\\n``, ``\\r\\n`` and ``\\r`` all end a line (even
when a ``\\r\\n`` pair is split across chunks), a leading BOM is dropped, ``:`` lines are
comments (keep-alive pings), ``data:`` lines accumulate and a blank line dispatches. Two
deliberate departures, both for measuring rather than rendering: a stream that ends without the
final blank line still dispatches its last event on ``flush()``, and a line longer than
``max_line``, or an event whose data lines add up to more, is not buffered (memory stays
bounded) but discarded, with the event it belonged to, and counted in ``malformed``. The bytes
themselves are relayed by the proxy regardless.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Protocol

_BOM = b"\xef\xbb\xbf"


class Framing(Protocol):
    """What the observer needs of a decoder: payloads in, and a count of what was not."""

    malformed: int

    def payloads(self, chunk: bytes) -> list[bytes]: ...
    def flush_payloads(self) -> list[bytes]: ...


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event. ``event`` is "" for the default ``message`` type."""

    data: bytes
    event: str = ""
    id: str | None = None


class LineBuffer:
    """Bytes -> complete lines, for both decoders (httpx's ``LineDecoder``, less the CR
    handling, which is SSE's alone): ``lines(chunk)`` gives the lines a read completes, without
    their LF, and keeps the unfinished last one for the next read. A line longer than
    ``max_line`` is dropped, whole in one read or not, with bounded memory: ``None`` stands in
    its place (the SSE decoder must know where in the stream it was)."""

    __slots__ = ("_discarding", "_max_line", "_tail", "_tail_len")

    def __init__(self, max_line: int) -> None:
        self._max_line = max_line
        self._tail: list[bytes] = []  # pieces of the unfinished last line
        self._tail_len = 0
        self._discarding = False  # inside an over-long line: drop bytes until its end

    @property
    def pending(self) -> bool:
        """A line is unfinished (or being dropped)."""
        return bool(self._tail) or self._discarding

    @property
    def buffered(self) -> int:
        """Bytes held for the unfinished line (at most ``max_line``)."""
        return self._tail_len

    def lines(self, chunk: bytes) -> list[bytes | None]:
        if self._discarding:
            end = chunk.find(b"\n")
            if end < 0:
                return []
            self._discarding = False
            chunk = chunk[end + 1 :]
        lines: list[bytes | None] = list(chunk.split(b"\n"))
        last = lines.pop()
        assert last is not None
        if self._tail and lines:
            lines[0] = b"".join(self._tail) + (lines[0] or b"")
            self._tail.clear()
            self._tail_len = 0
        limit = self._max_line
        for i, line in enumerate(lines):
            if line is not None and len(line) > limit:  # as if it had arrived in pieces
                lines[i] = None
        if last:
            self._tail.append(last)
            self._tail_len += len(last)
            if self._tail_len > limit:
                self._tail.clear()
                self._tail_len = 0
                self._discarding = True
                lines.append(None)
        return lines

    def flush(self) -> bytes:
        """End of stream: the unfinished last line (b"" if none), and a fresh start."""
        line = b"".join(self._tail)
        self._tail.clear()
        self._tail_len = 0
        self._discarding = False
        return line


class SseDecoder:
    """Incremental SSE parser: ``feed(bytes) -> [SseEvent]``, then ``flush()`` at the end."""

    __slots__ = (
        "_broken",
        "_buffer",
        "_data",
        "_data_len",
        "_event",
        "_head",
        "_last_id",
        "_max_line",
        "_skip_lf",
        "_started",
        "comments",
        "idle",
        "malformed",
    )

    def __init__(self, max_line: int = 1 << 20) -> None:
        self._max_line = max_line
        self._buffer = LineBuffer(max_line)
        self._skip_lf = False  # the previous chunk ended in "\r": a leading "\n" is its pair
        self._started = False
        self._head = b""  # the first bytes, while they may still be the start of a BOM
        self._data: list[bytes] = []
        self._data_len = 0
        self._event = ""
        self._last_id: str | None = None
        self._broken = False  # the pending event lost a line: do not dispatch it
        # started, and nothing pending: the next read's events are its own (the fast paths,
        # here and in the observer, may run)
        self.idle = False
        self.malformed = 0
        self.comments = 0

    @property
    def buffered(self) -> int:
        """Bytes held between reads: the unfinished line and the pending event's data lines
        (each bounded by ``max_line``)."""
        return self._buffer.buffered + self._data_len

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Consume ``chunk`` and return the events it completes, in order."""
        events = self._feed(chunk)
        self._settle()
        return events

    def _settle(self) -> None:
        """After the slow path: may the next read take the fast one?"""
        self.idle = self._started and not (
            self._data or self._event or self._broken or self._skip_lf or self._buffer.pending
        )

    def _feed(self, chunk: bytes) -> list[SseEvent]:
        events: list[SseEvent] = []
        if not chunk:
            return events
        if not self._started:
            chunk = self._head + chunk
            if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
                self._head = chunk  # a BOM split across reads is still a BOM
                return events
            self._started = True
            self._head = b""
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if 13 in chunk:  # a CR (as an int: ``bytes in bytes`` raises and clears a TypeError)
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        for line in self._buffer.lines(chunk):
            if line is None:  # over-long: dropped, and with it the event it belonged to
                self._broken = True
                self.malformed += 1
            else:
                self._line(line, events)
        return events

    def payloads(self, chunk: bytes) -> list[bytes]:
        """``feed``, keeping only each event's data: what the dialects read.

        Fast path for what engines send: with nothing pending, a read made of whole events of
        one ``data:`` line each (``data: {...}\\n\\n`` ...) is cut with ``find`` and no
        ``SseEvent``; at the first thing it does not expect (a comment, ``event:``, ``\\r``,
        several data lines, a partial event, an over-long line) the whole read goes through
        ``feed`` from the same state, so both give the same payloads.
        """
        if not self._started and not self._head and chunk[:1] not in (b"", _BOM[:1]):
            self._started = self.idle = True  # the first read, with no BOM: nothing pending
        if self.idle and 13 not in chunk:  # CR; an int is looked for with memchr: cheaper
            size = len(chunk)
            end = chunk.find(10)  # LF
            # the usual read: one event, as the loop's first round would take it
            if (
                end == size - 2
                and chunk[-1] == 10
                and end <= self._max_line
                and chunk.startswith(b"data:")
            ):
                return [chunk[6 if chunk[5] == 32 else 5 : end]]
            out = []
            pos = 0
            limit = self._max_line
            while True:
                end = chunk.find(10, pos)  # LF
                if (
                    end < 0
                    or end + 1 == size
                    or chunk[end + 1] != 10
                    or end - pos > limit
                    or not chunk.startswith(b"data:", pos)
                ):
                    break
                out.append(chunk[pos + 6 if chunk[pos + 5] == 32 else pos + 5 : end])
                pos = end + 2
                if pos == size:
                    return out
        return [event.data for event in self.feed(chunk)]

    def flush_payloads(self) -> list[bytes]:
        if self.idle:  # nothing pending (a stream of whole events): flush would find nothing
            return []
        return [event.data for event in self.flush()]

    def flush(self) -> list[SseEvent]:
        """End of stream: finish the last line and dispatch a pending event, if any."""
        events: list[SseEvent] = []
        last = self._head + self._buffer.flush()  # (a stream that was only a BOM's start)
        self._head = b""
        if last:
            self._line(last, events)
        self._line(b"", events)
        self._settle()
        return events

    def _line(self, line: bytes, events: list[SseEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._append(value[1:] if value[:1] == b" " else value)
            return
        if line[:1] == b":":
            self.comments += 1
            return
        self._field(line)

    def _dispatch(self, events: list[SseEvent]) -> None:
        """A blank line: the pending event is dispatched (unless broken), and the next
        begins."""
        if self._data and not self._broken:
            events.append(SseEvent(b"\n".join(self._data), self._event, self._last_id))
        elif self._broken:
            self._broken = False
        self._data = []
        self._data_len = 0
        self._event = ""

    def _field(self, line: bytes) -> None:
        """A line of another field than ``data:`` (or a data line without its colon)."""
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":  # "data" with no colon: an empty data line
            self._append(b"")
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        elif field == b"id":
            if 0 not in value:  # no NUL
                self._last_id = value.decode("utf-8", "replace")
        elif field != b"retry":
            self.malformed += 1  # not an SSE field: e.g. a raw JSON line

    def _append(self, value: bytes) -> None:
        """Add a data line to the pending event, unless the event is broken or too large."""
        if self._broken:
            return  # it will not be dispatched: keep nothing of it
        self._data_len += len(value) + 1
        if self._data_len > self._max_line:  # endless data lines: bounded like one long line
            self._broken = True
            self.malformed += 1
            self._data = []
            self._data_len = 0
            return
        self._data.append(value)


class NdjsonDecoder:
    """Incremental newline-delimited JSON framing: ``feed(bytes) -> [line]``, ``flush()``.

    Returns the raw bytes of each non-blank line (without its ``\\n`` / ``\\r\\n``); parsing is
    the dialect's job. Lines longer than ``max_line`` are dropped and counted, with bounded
    memory, whether they arrive in one chunk or many.
    """

    __slots__ = ("_buffer", "comments", "malformed")

    def __init__(self, max_line: int = 1 << 20) -> None:
        self._buffer = LineBuffer(max_line)
        self.malformed = 0
        self.comments = 0  # NDJSON has none; kept so both decoders answer the same questions

    @property
    def buffered(self) -> int:
        """Bytes held for the unfinished line (at most ``max_line``)."""
        return self._buffer.buffered

    def feed(self, chunk: bytes) -> list[bytes]:
        out = []
        for line in self._buffer.lines(chunk):
            if line is None:  # over-long: dropped
                self.malformed += 1
                continue
            payload = line.rstrip(b"\r")
            if payload.strip():
                out.append(payload)
        return out

    def payloads(self, chunk: bytes) -> list[bytes]:
        return self.feed(chunk)

    def flush_payloads(self) -> list[bytes]:
        return self.flush()

    def flush(self) -> list[bytes]:
        line = self._buffer.flush().rstrip(b"\r")
        return [line] if line.strip() else []


class GrpcDecoder:
    """gRPC's length-prefixed messages (a compressed flag, a 4-byte big-endian length, the
    message): ``payloads(chunk) -> [message]``. A message longer than ``max_message`` is
    skipped with bounded memory, and counted; so is a compressed one, unless the stream's
    ``grpc-encoding`` is gzip or deflate, whose messages are inflated up to the same bound. A
    message cut by the stream's end is counted at ``flush_payloads``. The reads of a message
    not yet whole are kept apart and joined once it is (a copy per message, not per read).
    Written here, not taken from grpcio: its framing is inside its C core, not exposed per
    message."""

    __slots__ = ("_encoding", "_have", "_max", "_need", "_parts", "_skip", "idle", "malformed")

    def __init__(self, max_message: int, encoding: str = "identity") -> None:
        self._max = max_message
        self._encoding = encoding.strip().lower()
        self._parts: list[bytes] = []  # the reads of a message not yet whole
        self._have = 0  # ... their bytes
        self._need = 0  # ... and the bytes it takes to go on: its prefix, or all of it
        self._skip = 0  # bytes of an over-long message still to pass
        self.idle = True  # no partial message held
        self.malformed = 0

    def payloads(self, chunk: bytes) -> list[bytes]:
        if self._skip:
            taken = min(self._skip, len(chunk))
            self._skip -= taken
            chunk = chunk[taken:]
        if self._parts:
            self._parts.append(chunk)
            self._have += len(chunk)
            if self._have < self._need:
                return []
            buf = b"".join(self._parts)
            self._parts = []
        else:
            buf = chunk
        out: list[bytes] = []
        pos, size = 0, len(buf)
        while size - pos >= 5:
            length = int.from_bytes(buf[pos + 1 : pos + 5], "big")
            if length > self._max:  # skipped, never held: bounded memory
                self.malformed += 1
                self._skip = max(0, length - (size - pos - 5))
                pos = min(size, pos + 5 + length)
                continue
            end = pos + 5 + length
            if end > size:
                break
            message: bytes | None = buf[pos + 5 : end]
            if buf[pos] and message is not None:
                message = self._inflate(message)
            if message is not None:
                out.append(message)
            pos = end
        if pos < size:
            rest = buf[pos:]
            self._parts, self._have = [rest], len(rest)
            self._need = 5 if len(rest) < 5 else 5 + int.from_bytes(rest[1:5], "big")
        self.idle = not self._parts and not self._skip
        return out

    def _inflate(self, message: bytes) -> bytes | None:
        """A compressed message, inflated (bounded) if its encoding is known; else None."""
        wbits = {"gzip": 31, "deflate": 15}.get(self._encoding)
        if wbits is None:
            self.malformed += 1  # an encoding not known here (or none named): unparsed
            return None
        try:
            inflater = zlib.decompressobj(wbits)
            out = inflater.decompress(message, self._max)
        except zlib.error:
            self.malformed += 1
            return None
        if inflater.unconsumed_tail:
            self.malformed += 1  # inflates past the bound
            return None
        return out

    def flush_payloads(self) -> list[bytes]:
        """The stream ended: a message it cut short is counted (nothing to read in it)."""
        if self._parts or self._skip:
            self.malformed += 1
        self._parts, self._have, self._skip, self.idle = [], 0, 0, True
        return []
