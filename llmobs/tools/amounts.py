"""An amount as a person reads it: the figures it needs and its unit, for every report.

A cost of a few requests is a few hundred-thousandths of a euro: printed with two decimals it
reads ``0.00``, as if nothing were spent. ``amount`` keeps at least two decimals (cents, for
a currency) and at least two significant figures, whichever needs more, then drops the zeros
the second figure left past the second decimal; groups thousands with commas; and puts the
unit after a space:

- ``1234.5, "EUR"`` -> ``1,234.50 EUR``; ``0.5`` -> ``0.50``; ``0.034`` -> ``0.034``;
- ``9e-05, "EUR"`` -> ``0.00009 EUR`` (not ``9e-05``: a reader compares it with the row
  above at a glance); ``1.234e-05`` -> ``0.000012``;
- below a millionth, where zeros no longer count at a glance: ``3.0e-08``;
- ``0`` -> ``0.00``; not a number -> ``n/a``.

The live page's script (``export/ui/static/page.js``, ``amount``) applies the same rule to
its cost axis; the JSON reports keep their numbers as numbers.
"""

from __future__ import annotations

import math

DECIMALS = 2  # at least: cents
FIGURES = 2  # at least: significant figures
SCIENTIFIC_BELOW = 1e-6  # smaller amounts in scientific notation


def amount(value: float, unit: str = "") -> str:
    """``value`` with the decimals it needs (see the module) and ``unit`` after a space."""
    text = _number(value)
    return f"{text} {unit}" if unit and text != "n/a" else text


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    size = abs(value)
    if size == 0:
        return f"{0:.{DECIMALS}f}"
    if size < SCIENTIFIC_BELOW:
        return f"{value:.{FIGURES - 1}e}"
    exponent = math.floor(math.log10(size))
    places = max(DECIMALS, FIGURES - 1 - exponent)
    text = f"{value:,.{places}f}"
    if places == DECIMALS:
        return text
    whole, fraction = text.split(".")
    return f"{whole}.{fraction.rstrip('0').ljust(DECIMALS, '0')}"
