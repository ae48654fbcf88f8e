"""HTTP/1.1 sans I/O: heads and bodies, for both legs of the relay.

The relay speaks HTTP at the protocol level on both sides (``server`` to clients, ``upstream``
to the engine) so that each network read is handled inside ``data_received``, with no task
switch per chunk and no framework objects per request. These are the pure parts: bytes in,
heads and payload bytes out, no clock, no sockets, property-tested under every chunking. A
body decoder's ``feed`` returns the payload a read carried as one ``bytes`` (the observer
times reads, and an SSE event split over chunks is the framing layer's business), and sets
``done`` at the end of the body; bytes after it are kept in ``extra`` (a response's make the
connection unfit for reuse; a request's are the next pipelined request).
"""

from __future__ import annotations

import re
from enum import IntEnum
from typing import NamedTuple
from urllib.parse import unquote

from multidict import CIMultiDict

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; more is not an engine talking
MAX_REQUEST_HEAD_BYTES = 32 * 1024  # a client's request line and headers (then 431)
MAX_REQUEST_HEADERS = 128
MAX_CHUNK_LINE = 4096  # a chunk-size line with extensions

# Byte sets, tested as ``x.lstrip(SET)``: empty exactly when every byte of ``x`` is in SET.
# A memchr per byte, and an empty result is a shared object: a third of ``translate(None,
# SET)``'s time (which builds a table each call), and a fifth of ``re``'s.
#
# RFC 9110 token characters (methods, field names).
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


_HEX = b"0123456789abcdefABCDEF"

# What a request target may hold (RFC 9112 3.2, RFC 3986): anything but controls and DEL; a
# space ends it. A CR or LF inside one would become a header line of its own in the request
# sent upstream.
_TARGET = bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))

# A single byte is looked for as an int (``13 in value``): ``bytes in bytes`` first tries the
# needle as an int, and the TypeError it raises and clears costs ~200 ns.
_CR, _LF, _NUL, _DOT, _PERCENT = 13, 10, 0, 46, 37


def _is_digits(value: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes "²", which ``int`` then refuses."""
    return value.isascii() and value.isdigit()


def content_length(headers: CIMultiDict[str]) -> int | None:
    """The ``Content-Length`` a head declares, if it is one plain number (else None: the
    body decoders are what refuses a bad one)."""
    value = headers.get("Content-Length")
    if value is None:
        return None
    value = value.strip()
    return int(value) if _is_digits(value) else None


class ProtocolError(ConnectionError):
    """The peer sent something that is not HTTP/1.x (the connection is then dropped)."""


class BadRequest(ProtocolError):
    """A client's request the server answers with ``status`` (400, 431, 501, 505) and closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ResponseHead(NamedTuple):
    """A parsed status line and header block (a named tuple: one per response, made in a
    third of a frozen dataclass's time; compare heads field by field)."""

    version: tuple[int, int]
    status: int
    reason: str
    headers: CIMultiDict[str]
    fields: list[tuple[str, str]]  # the same headers, in order: what a relay passes on

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may carry another request after this response."""
        return _keep_alive(self.version, self.headers)


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
    # Every header goes on to the client as it came: no CR but at a line's end, and no NUL,
    # which would end a line early for the client or be read as one by another parser
    # (response splitting); a name is a token (a line that starts with whitespace, obsolete
    # folding, is not). nginx answers such a head with 502 too.
    if _NUL in raw or _CR in status_line:
        raise ProtocolError("a NUL or a bare CR in the response head")
    fields: list[tuple[str, str]] = []
    for raw_line in lines[1:]:
        line = raw_line.rstrip(b"\r")
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name.lstrip(_TOKEN) or _CR in value:
            raise ProtocolError(f"bad header line: {line[:64]!r}")
        fields.append((name.decode("ascii"), value.strip().decode("latin-1")))
    reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
    return ResponseHead((1, int(minor)), int(parts[1]), reason, CIMultiDict(fields), fields)


class RequestHead(NamedTuple):
    """A parsed request line and header block, as a client sent it (a named tuple, as
    ``ResponseHead``)."""

    method: str
    target: str  # origin form: path and query, as sent (never decoded)
    version: tuple[int, int]
    headers: CIMultiDict[str]
    fields: list[tuple[str, str]]  # the same headers, in order: what a relay passes on

    @property
    def path(self) -> str:
        """The target's path, percent-decoded, without the query."""
        path = self.target.split("?", 1)[0]
        return unquote(path) if "%" in path else path

    @property
    def keep_alive(self) -> bool:
        """Whether the client asks to keep the connection after this exchange."""
        return _keep_alive(self.version, self.headers)


def _keep_alive(version: tuple[int, int], headers: CIMultiDict[str]) -> bool:
    values = headers.getall("Connection", ())
    if not values:
        return version >= (1, 1)
    tokens = {t.strip().lower() for v in values for t in v.split(",")}
    if version >= (1, 1):
        return "close" not in tokens
    return "keep-alive" in tokens


def climbs_above_root(target: str) -> bool:
    """Whether the path of ``target``, percent-decoded, has more ``..`` segments than
    segments before them (RFC 3986 5.2.4 would stop at the root; nginx answers 400). The
    relay passes a path on as sent, behind ``--upstream``'s base path: ``/../admin`` would
    reach the engine as ``/base/../admin``, which it resolves outside the base."""
    path = unquote(target.split("?", 1)[0])
    depth = 0
    for segment in path.split("/")[1:]:
        if segment == "..":
            depth -= 1
            if depth < 0:
                return True
        elif segment != ".":
            depth += 1
    return False


def parse_request_head(raw: bytes) -> RequestHead:
    """Parse ``raw`` (request line and headers, without the blank line that ends them).

    Strict where leniency lets two parsers disagree about a message (RFC 9112 sections 2.2,
    3, 5 and 11: lines end with CRLF, no whitespace before a colon, no obsolete line folding,
    no CR, LF or NUL inside a value): the relay re-frames every request it forwards, but
    headers pass on as sent.
    """
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[1] or not parts[0] or parts[0].lstrip(_TOKEN):
        raise BadRequest(400, "malformed request line")
    version = parts[2]
    if len(version) != 8 or not version.startswith(b"HTTP/") or version[6:7] != b".":
        raise BadRequest(400, "malformed request line")
    if version[5:6] != b"1" or version[7:8] not in (b"0", b"1"):
        raise BadRequest(505, "HTTP version not supported")
    if parts[0] == b"CONNECT":  # a tunnel: a reverse proxy has none to offer (as nginx)
        raise BadRequest(405, "CONNECT is not supported")
    target = parts[1]
    if target.lstrip(_TARGET):
        raise BadRequest(400, "invalid character in the request target")
    if target[:1] != b"/":
        scheme, sep, rest = target.partition(b"://")
        if not sep or scheme.lower() not in (b"http", b"https"):
            raise BadRequest(400, "request target not in origin or absolute form")
        # absolute form: the authority is ours; the path (may be empty) and query are kept
        cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
        target = rest[cut:]
        if target[:1] != b"/":
            target = b"/" + target
    # "." or "%" (ints: see _CR) first: most paths have neither, and need no decoding
    if (_DOT in target or _PERCENT in target) and climbs_above_root(target.decode("latin-1")):
        raise BadRequest(400, "the request path climbs above the root")
    if len(lines) > MAX_REQUEST_HEADERS + 1:
        raise BadRequest(431, "too many header fields")
    fields: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name.lstrip(_TOKEN):
            raise BadRequest(400, "malformed header field")
        value = value.strip(b" \t")
        if _CR in value or _LF in value or _NUL in value:
            raise BadRequest(400, "invalid character in a header field")
        fields.append((name.decode("ascii"), value.decode("latin-1")))
    return RequestHead(
        parts[0].decode("ascii"),
        target.decode("latin-1"),
        (1, version[7] - 48),
        CIMultiDict(fields),
        fields,
    )


class BodyDecoder:
    """Base of the body decoders: ``feed`` a read, get its payload.

    ``whole`` says that the last read was exactly whole chunks of a chunked body (the last
    chunk included when ``done``, then with no trailer): the read itself is then a valid
    ``chunked`` framing of its payload, and a relay whose client side is chunked too can
    write it on as it came, with no re-framing (``proxy``).

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
# one-slice cache, warm, where a stored one is an object more to fetch on every read.
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

    Why our own: httptools (llhttp) decodes 1-byte chunks ~20 times faster, but tells no
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
        if self.done:
            self.extra += data
            self.whole = False
            return b""
        if self.backlog:  # the caller must ``resume`` first: keep the order of the bytes
            self._rest = self._rest[self._rest_at :] + data
            self._rest_at = 0
            return self.resume()
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
                    if len(self._frames) >= _FRAMES:
                        self._frames.clear()
                    self._frames[stop + 2] = (end + 2, data[: end + 2])
                    return data[end + 2 : stop]  # exactly one chunk: the hot path
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


def body_decoder(head: ResponseHead, method: str, frames: Frames | None = None) -> BodyDecoder:
    """The decoder RFC 9112 section 6.3 prescribes for this response; a chunked body
    remembers its one-chunk read lengths in ``frames`` (the upstream pool's, shared by
    all its connections) when given."""
    status = head.status
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return NoBody()
    encoding = head.headers.get("Transfer-Encoding", "")
    if encoding:
        if encoding.replace(" ", "").lower().rsplit(",", 1)[-1] == "chunked":
            return ChunkedBody(frames=frames)
        return CloseBody()  # another final coding: read until close
    lengths = head.headers.getall("Content-Length", ())
    if lengths:
        values = {v.strip() for line in lengths for v in line.split(",")}  # "5, 5" is one
        value = values.pop()
        if values or not _is_digits(value):
            raise ProtocolError(f"bad Content-Length: {lengths!r}")
        return LengthBody(int(value))
    return CloseBody()


def request_body_decoder(head: RequestHead) -> BodyDecoder | None:
    """The decoder of a request's body (RFC 9112 section 6.3); None when it has none.

    A request that carries both framings, or whose last transfer coding is not chunked, is
    refused with 400 (section 6.1: the usual smuggling vector), as are conflicting lengths;
    one with another coding before chunked gets 501 (section 6.1, not implemented).
    """
    headers = head.headers
    encoding = headers.get("Transfer-Encoding")
    lengths = headers.getall("Content-Length", ())
    if encoding is not None:
        if lengths:
            raise BadRequest(400, "both Transfer-Encoding and Content-Length")
        codings = ",".join(headers.getall("Transfer-Encoding")).replace(" ", "").lower()
        if codings.rsplit(",", 1)[-1] != "chunked":
            raise BadRequest(400, "chunked is not the final transfer coding")
        if codings != "chunked":
            raise BadRequest(501, "transfer coding not implemented")
        return ChunkedBody(strict=True)
    if not lengths:
        return None
    values = {v.strip() for line in lengths for v in line.split(",")}
    value = values.pop()
    if values or not _is_digits(value) or len(value) > 18:
        raise BadRequest(400, "invalid Content-Length")
    length = int(value)
    return LengthBody(length) if length else None
