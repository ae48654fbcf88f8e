"""Log lines that a client cannot forge, and the process's log configuration.

The relay logs what goes wrong with a request by its method and its GenAI operation (a closed
set), never its path, query or body: a path can hold secrets, and bytes a client chose must
not reach a log pipeline that splits records on line ends. As a second line of defence every
formatted message has its control characters escaped, so that a value that slips into a log
call (an exception's text, say) still cannot start a line of its own.
"""

from __future__ import annotations

import logging
import sys

# RFC 9110 section 9 and PATCH (RFC 5789): any other method is logged as ``_OTHER``, as the
# OpenTelemetry HTTP conventions name it on spans.
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)

# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: each one is written
# as its escape (``\x0a``, ``\u2028``), never as itself.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES.update({c: f"\\u{c:04x}" for c in (0x2028, 0x2029)})


def method_label(method: str) -> str:
    """A method as it may be logged: a standard one, else ``_OTHER`` (a bounded set)."""
    return method if method in KNOWN_METHODS else "_OTHER"


def escape(text: str) -> str:
    """``text`` with every control character escaped: one line, whatever it held."""
    return text.translate(_ESCAPES)


class EscapingFormatter(logging.Formatter):
    """A formatter whose message part (the record's text and its arguments, as formatted)
    is escaped; a traceback, appended after it, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))


FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str) -> None:
    """Log to stderr at ``level``, every message escaped (the CLI calls this, never import)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
