"""HTTP/1.1 responses, sans I/O: the head parser and the body decoders of the upstream leg.

The relay reads the engine's response at the protocol level (``upstream``) so that each
network read is handled inside ``data_received``, with no task switch per chunk. These are the
pure parts: bytes in, payload bytes out, no clock, no sockets, property-tested under every
chunking. A body decoder's ``feed`` returns the payload a read carried as one ``bytes`` (the
observer times reads, and an SSE event split over chunks is the framing layer's business), and
sets ``done`` at the end of the body; bytes after it are kept in ``extra``, which makes the
connection unfit for reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from multidict import CIMultiDict

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; more is not an engine talking
MAX_CHUNK_LINE = 4096  # a chunk-size line with extensions


class ProtocolError(ConnectionError):
    """The upstream sent something that is not HTTP/1.x (the connection is then dropped)."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A parsed status line and header block."""

    version: tuple[int, int]
    status: int
    reason: str
    headers: CIMultiDict[str]

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may carry another request after this response."""
        tokens = {
            t.strip().lower() for v in self.headers.getall("Connection", ()) for t in v.split(",")
        }
        if self.version >= (1, 1):
            return "close" not in tokens
        return "keep-alive" in tokens


def parse_head(raw: bytes) -> ResponseHead:
    """Parse ``raw`` (status line and headers, without the blank line that ends them)."""
    lines = raw.split(b"\n")
    status_line = lines[0].rstrip(b"\r")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[0]) != 8:
        raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:64]!r}")
    minor = parts[0][7:8]
    if not parts[1].isdigit() or len(parts[1]) != 3 or not minor.isdigit():
        raise ProtocolError(f"bad status line: {status_line[:64]!r}")
    headers: CIMultiDict[str] = CIMultiDict()
    for raw_line in lines[1:]:
        line = raw_line.rstrip(b"\r")
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in b" \t":
            raise ProtocolError(f"bad header line: {line[:64]!r}")
        headers.add(name.decode("latin-1"), value.strip().decode("latin-1"))
    reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
    return ResponseHead((1, int(minor)), int(parts[1]), reason, headers)


class BodyDecoder:
    """Base of the body decoders: ``feed`` a read, get its payload."""

    __slots__ = ("done", "extra")

    def __init__(self) -> None:
        self.done = False
        self.extra = b""  # bytes after the end of the body

    def feed(self, data: bytes) -> bytes:
        raise NotImplementedError

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

    __slots__ = ("remaining",)

    def __init__(self, length: int) -> None:
        super().__init__()
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


_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class ChunkedBody(BodyDecoder):
    """``Transfer-Encoding: chunked``; chunk extensions ignored, trailers dropped.

    The common case, a read that holds exactly one whole chunk (how engines write a token),
    takes one ``find`` and one slice.
    """

    __slots__ = ("_line", "_remaining", "_state")

    def __init__(self) -> None:
        super().__init__()
        self._state = _SIZE
        self._line = b""  # a size or trailer line split across reads
        self._remaining = 0  # payload bytes left in the current chunk

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.extra += data
            return b""
        if self._state == _SIZE and not self._line:
            end = data.find(b"\r\n")
            if end > 0:
                size = self._size(data[:end])
                stop = end + 2 + size
                if size and len(data) == stop + 2 and data.endswith(b"\r\n"):
                    return data[end + 2 : stop]  # exactly one chunk: the hot path
        return self._feed(data)

    @staticmethod
    def _size(line: bytes) -> int:
        digits = line.split(b";", 1)[0].strip()
        if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
            raise ProtocolError(f"bad chunk size line: {line[:64]!r}")
        return int(digits, 16)

    def _feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n and not self.done:
            state = self._state
            if state == _DATA:
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
                if len(self._line) > MAX_CHUNK_LINE:
                    raise ProtocolError("chunk line too long")
                break
            line = (self._line + data[pos:end]).rstrip(b"\r")
            self._line = b""
            pos = end + 1
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
        if pos < n and self.done:
            self.extra = data[pos:]
        return b"".join(out)


def body_decoder(head: ResponseHead, method: str) -> BodyDecoder:
    """The decoder RFC 9112 section 6.3 prescribes for this response."""
    status = head.status
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return NoBody()
    encoding = head.headers.get("Transfer-Encoding", "")
    if encoding:
        if encoding.replace(" ", "").lower().rsplit(",", 1)[-1] == "chunked":
            return ChunkedBody()
        return CloseBody()  # another final coding: read until close
    lengths = head.headers.getall("Content-Length", ())
    if lengths:
        values = {v.strip() for line in lengths for v in line.split(",")}  # "5, 5" is one
        value = values.pop()
        if values or not value.isdigit():
            raise ProtocolError(f"bad Content-Length: {lengths!r}")
        return LengthBody(int(value))
    return CloseBody()
