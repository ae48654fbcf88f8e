"""What a request cost (``observe.cost``) at the price file's prices (``config.prices``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmobs.config.objectives import Objective
from llmobs.config.options import ConfigError
from llmobs.config.prices import Price, Prices, load_prices
from llmobs.observe.cost import cost_verdict, request_cost
from llmobs.observe.slo import GOOD, Verdict
from llmobs.observe.timing import Outcome, RequestStats, TokenSource

PRICE = Price(input=2.0, output=8.0, cached_input=0.5, reasoning=10.0)


def stats(inputs: int | None, outputs: int, cached: int | None = None,
          reasoning: int | None = None) -> RequestStats:  # fmt: skip
    return RequestStats(
        "chat", "m", Outcome.OK, 200, True, 1.0, 0.1, 0.01, inputs, outputs, TokenSource.USAGE,
        outputs, 0.0, 0.0, 0.0, 0.0, 0, None, reasoning_tokens=reasoning, cached_tokens=cached,
    )  # fmt: skip


def test_each_kind_of_token_at_its_price() -> None:
    # 1,000,000 input of which 250,000 cached; 100,000 output of which 40,000 reasoning
    cost = request_cost(PRICE, stats(1_000_000, 100_000, 250_000, 40_000))
    assert cost == pytest.approx(750_000 * 2e-6 + 250_000 * 0.5e-6 + 60_000 * 8e-6 + 40_000 * 1e-5)
    assert request_cost(PRICE, stats(10, 5)) == pytest.approx((10 * 2 + 5 * 8) / 1e6)
    assert request_cost(PRICE, stats(None, 5)) == pytest.approx(40 / 1e6)  # no input count
    # counts past their whole are capped by it
    assert request_cost(PRICE, stats(10, 5, cached=50, reasoning=9)) == pytest.approx(
        (10 * 0.5 + 5 * 10) / 1e6)  # fmt: skip
    assert request_cost(None, stats(10, 5)) is None


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


def test_a_costs_verdict_label() -> None:
    bad = Verdict(False, (Objective.TTFT,), ("queue",))
    assert [cost_verdict(v) for v in (None, GOOD, bad)] == ["none", "good", "bad"]
