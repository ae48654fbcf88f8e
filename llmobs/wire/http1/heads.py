"""HTTP/1.1 heads, sans I/O: a client's request line and fields, an engine's status line and
fields, parsed from bytes (without the blank line that ends them), strictly where two parsers
could disagree."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote

from multidict import CIMultiDict

from llmobs.wire.http1.errors import BadRequest, ProtocolError

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; more is not an engine talking
MAX_REQUEST_HEAD_BYTES = 32 * 1024  # a client's request line and headers (then 431)
MAX_REQUEST_HEADERS = 128

# Byte sets, tested as ``x.lstrip(SET)``: empty exactly when every byte of ``x`` is in SET.
# A memchr per byte, and an empty result is a shared object: cheaper than ``translate`` (which
# builds a table each call) or ``re`` (docs/benchmarks.md).
#
# RFC 9110 token characters (methods, field names).
TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

# What a request target may hold (RFC 9112 3.2, RFC 3986): anything but controls and DEL; a
# space ends it. A CR or LF inside one would become a header line of its own in the request
# sent upstream.
_TARGET = bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))

# A single byte is looked for as an int (``13 in value``): ``bytes in bytes`` first tries the
# needle as an int, and the TypeError it raises and clears costs ~200 ns.
_CR, _LF, _NUL, _DOT, _PERCENT = 13, 10, 0, 46, 37


class ResponseHead(NamedTuple):
    """A parsed status line and header block (a named tuple: one per response, made in a
    third of a frozen dataclass's time; compare heads field by field)."""

    version: tuple[int, int]
    status: int
    reason: str
    headers: CIMultiDict[str]
    fields: list[tuple[str, str]]  # the same headers, in order: what a relay passes on


def parse_response_head(raw: bytes) -> ResponseHead:
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
        if not sep or not name or name.lstrip(TOKEN) or _CR in value:
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
    method, target, minor = _request_line(lines[0])
    if len(lines) > MAX_REQUEST_HEADERS + 1:
        raise BadRequest(431, "too many header fields")
    fields = _request_fields(lines[1:])
    return RequestHead(method, target, (1, minor), CIMultiDict(fields), fields)


def _request_line(line: bytes) -> tuple[str, str, int]:
    """Method, target (origin form) and minor version of a request line."""
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[1] or not parts[0] or parts[0].lstrip(TOKEN):
        raise BadRequest(400, "malformed request line")
    version = parts[2]
    if len(version) != 8 or not version.startswith(b"HTTP/") or version[6:7] != b".":
        raise BadRequest(400, "malformed request line")
    if version[5:6] != b"1" or version[7:8] not in (b"0", b"1"):
        raise BadRequest(505, "HTTP version not supported")
    if parts[0] == b"CONNECT":  # a tunnel: a reverse proxy has none to offer (as nginx)
        raise BadRequest(405, "CONNECT is not supported")
    return parts[0].decode("ascii"), origin_form(parts[1]), version[7] - 48


def origin_form(target: bytes) -> str:
    """A request target in origin form: as sent, or the path and query of an absolute one
    (its authority is ours); refused if it holds a control byte or climbs above the root."""
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
    text = target.decode("latin-1")
    # "." or "%" (ints: see _CR) first: most paths have neither, and need no decoding
    if (_DOT in target or _PERCENT in target) and climbs_above_root(text):
        raise BadRequest(400, "the request path climbs above the root")
    return text


def _request_fields(lines: list[bytes]) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name.lstrip(TOKEN):
            raise BadRequest(400, "malformed header field")
        value = value.strip(b" \t")
        if _CR in value or _LF in value or _NUL in value:
            raise BadRequest(400, "invalid character in a header field")
        fields.append((name.decode("ascii"), value.decode("latin-1")))
    return fields
