"""What a valid value is: bounds and choices, each declared beside its option.

A check is a function of one value that returns what is wrong with it, or None. An option
names its check where it is declared (``option(..., check=positive)``) and
``options.check_fields`` runs them all, prefixing the problem with the flag and the variable,
so a bound is written once, next to the default it bounds. An unset value (None) is never
checked: its option's help says what happens then.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

Check = Callable[[Any], "str | None"]


def positive(value: float) -> str | None:
    """Durations, factors and peaks: above zero (NaN is not)."""
    return None if value > 0 else f"must be > 0, got {value}"


def non_negative(value: float) -> str | None:
    """Intervals and shapes where 0 turns something off: zero or above (NaN is not)."""
    return None if value >= 0 else f"must be >= 0, got {value}"


def at_least_one(value: int) -> str | None:
    """Limits and counts that cannot be empty."""
    return None if value >= 1 else f"must be >= 1, got {value}"


def tcp_port(value: int) -> str | None:
    """A TCP port, or 0: one the system picks."""
    return None if 0 <= value <= 65535 else f"port out of range: {value}"


def fraction(value: float) -> str | None:
    """A share or a probability."""
    return None if 0.0 <= value <= 1.0 else f"must be within [0, 1], got {value}"


def between(low: float, high: float, unit: str) -> Check:
    """A value from ``low`` to ``high`` ``unit``, both included."""

    def check(value: float) -> str | None:
        return None if low <= value <= high else f"must be {low} to {high} {unit}, got {value}"

    return check


def one_of(choices: Collection[str], *, fold: bool = False) -> Check:
    """A name from a closed set; ``fold``: whatever its case."""

    def check(value: str) -> str | None:
        if (value.lower() if fold else value) in choices:
            return None
        return f"expected one of {', '.join(choices)}, got {value!r}"

    return check


def matches(pattern: str, what: str) -> Check:
    """Text the whole of which ``pattern`` matches; ``what`` says in words what it allows."""
    compiled = re.compile(pattern)

    def check(value: str) -> str | None:
        return None if compiled.fullmatch(value) else f"expected {what}, got {value!r}"

    return check


def http_url(value: str) -> str | None:
    """An http(s) URL with a host."""
    parts = urlsplit(value)
    if parts.scheme in ("http", "https") and parts.netloc:
        return None
    return f"expected an http(s) URL, got {value!r}"


def not_blank(value: str) -> str | None:
    """A name that must say something."""
    return None if value.strip() else "must not be empty"


def unless_empty(check: Check) -> Check:
    """``check``, for an option whose empty value means unset (its default takes over)."""

    def checked(value: str) -> str | None:
        return check(value) if value else None

    return checked
