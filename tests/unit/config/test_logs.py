"""Log lines a client cannot forge (``config.logs``): every control character escaped, a
method logged only when it is a standard one."""

from __future__ import annotations

import logging
import sys

from llmobs.config.logs import KNOWN_METHODS, EscapingFormatter, escape, method_label


def test_the_formatter_escapes_every_control_character() -> None:
    assert escape("a\nb\rc\x00d\x1be\x7ff\x85g\u2028h") == (
        "a\\x0ab\\x0dc\\x00d\\x1be\\x7ff\\x85g\\u2028h"
    )
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "llmobs", logging.ERROR, __file__, 1, "got %s", ("x\nCRITICAL forged",), None
        )
        record.exc_info = sys.exc_info()
    text = formatter.format(record)
    first, *rest = text.split("\n")
    assert first == "ERROR got x\\x0aCRITICAL forged"
    assert rest[0].startswith("Traceback")  # a traceback keeps its lines


def test_printable_text_is_left_alone() -> None:
    text = "POST chat/openai: model 'llamá' ✓ \t"
    assert escape(text) == text.replace("\t", "\\x09")


def test_a_method_is_logged_only_when_standard() -> None:
    assert {method_label(m) for m in KNOWN_METHODS} == set(KNOWN_METHODS)
    assert method_label("PATCH") == "PATCH"
    assert [method_label(m) for m in ("get", "BREW", "POST\n")] == ["_OTHER"] * 3
