"""What a request cost (``observe.cost``) at the price file's prices (``config.prices``)."""

from __future__ import annotations

import pytest

from llmobs.config.objectives import Objective
from llmobs.config.prices import Price
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


def test_a_costs_verdict_label() -> None:
    bad = Verdict(False, (Objective.TTFT,), ("queue",))
    assert [cost_verdict(v) for v in (None, GOOD, bad)] == ["none", "good", "bad"]
