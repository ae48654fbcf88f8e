"""The price file (``config.prices``): a model's prices, any other model's, and each mistake
refused naming the file and the entry. What a request cost: ``tests/unit/observe/test_cost.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmobs.config.options import ConfigError
from llmobs.config.prices import Price, Prices, load_prices

PRICE = Price(input=2.0, output=8.0, cached_input=0.5, reasoning=10.0)


def test_the_price_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("currency: EUR\nprices:\n  llama: {input: 1, output: 2.5, reasoning: 4}\n"
                    "  '*': {input: 0, output: 3}\n")  # fmt: skip
    prices = load_prices(str(path))
    assert prices.currency == "EUR"
    assert prices.of("llama") == Price(1.0, 2.5, 1.0, 4.0)  # cached input: input's price
    assert prices.of("other") == Price(0.0, 3.0, 0.0, 3.0)
    assert Prices("USD", {"a": PRICE}).of("b") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prices: {}\n", "'currency:' names one currency"),
        ("currency: US Dollars\nprices: {}\n", "'currency:' names one currency"),
        ("currency: USD\n", "expected 'currency:' and a mapping 'prices:'"),
        ("currency: USD\nprices:\n  m: 3\n", "prices.m: expected input and output prices"),
        ("currency: USD\nprices:\n  m: {input: 1}\n", "prices.m: the output price is missing"),
        ("currency: USD\nprices:\n  m: {input: 1, output: -2}\n", "a price must be >= 0"),
        ("currency: USD\nprices:\n  m: {input: 1, output: x}\n", r"prices.m.output: expected"),
        ("currency: USD\nprices:\n  m: {input: 1, output: .nan}\n", "expected a price"),
        ("currency: USD\nprices:\n  m: {input: 1, output: 2, cache: 1}\n", "unknown field"),
        ("currency: [\n", "prices.yaml"),
    ],
)
def test_a_bad_price_file_is_refused_with_where(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_prices(str(path))
