"""``tools.amounts``: an amount with the figures a reader needs and its unit."""

from __future__ import annotations

import math

import pytest

from llmobs.tools.amounts import amount


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (9e-05, "EUR", "0.00009 EUR"),  # a few requests' cost: not 0.00
        (1234.5, "EUR", "1,234.50 EUR"),  # cents, thousands grouped
        (1234567.891, "USD", "1,234,567.89 USD"),
        (0.5, "EUR", "0.50 EUR"),
        (0.034, "", "0.034"),  # two significant figures where two decimals hold one
        (1.234e-05, "EUR", "0.000012 EUR"),
        (0.0999, "", "0.10"),
        (1e-06, "", "0.000001"),
        (3e-08, "credits", "3.0e-08 credits"),  # below a millionth: scientific
        (0.0, "EUR", "0.00 EUR"),
        (12.345, "", "12.35"),
        (-0.5, "", "-0.50"),
    ],
)
def test_an_amount_keeps_its_figures_and_its_unit(value: float, unit: str, shown: str) -> None:
    assert amount(value, unit) == shown


def test_what_is_not_a_number_says_so_without_a_unit() -> None:
    assert amount(math.nan, "EUR") == "n/a"
    assert amount(math.inf) == "n/a"
