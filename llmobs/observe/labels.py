"""Bounded label values: a client must not be able to grow the number of metric series.

Model names come from request bodies, i.e. from clients. The first ``limit`` distinct values
are kept as they are (truncated to a sane length); every later one is reported as ``other``.
A missing model is ``unknown``. Per-request detail belongs on spans, never on labels.
"""

from __future__ import annotations

OTHER = "other"
UNKNOWN = "unknown"
MAX_LABEL_LENGTH = 128


class BoundedLabel:
    """Maps arbitrary strings onto at most ``limit`` values plus ``other`` and ``unknown``."""

    __slots__ = ("_known", "_reserved", "limit")

    def __init__(self, limit: int, reserved: frozenset[str] = frozenset()) -> None:
        """``reserved``: values the operator named (tenants of a key file), always their
        own label and not counted against ``limit``."""
        self.limit = limit
        self._known: set[str] = set()
        self._reserved = reserved

    def get(self, value: str | None, admit: bool = True) -> str:
        """The label for ``value``; a new value takes a free slot only when ``admit``.

        Callers admit values only from successful requests, so a client naming models the
        engine rejects (404s) cannot use up the slots of models deployed later.
        """
        if not value:
            return UNKNOWN
        value = value[:MAX_LABEL_LENGTH]
        if value in self._known or value in self._reserved:
            return value
        if admit and len(self._known) < self.limit and bounded(value) is not None:
            self._known.add(value)
            return value
        return OTHER

    def __len__(self) -> int:
        return len(self._known)


def bounded(value: str) -> str | None:
    """``value`` as a label may hold it: cut to ``MAX_LABEL_LENGTH``; None when it is not
    valid Unicode (a lone surrogate, a JSON escape the stdlib's parser accepts, would make
    every later rendering of /metrics fail to encode). For any label from outside."""
    value = value[:MAX_LABEL_LENGTH]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value
