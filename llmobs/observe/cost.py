"""What a request cost: its tokens at the price file's prices (``config.prices``), pure.

Input tokens less the cached ones at the input price, cached ones at theirs; output tokens
less the reasoning ones at the output price, reasoning ones at theirs (each defaults to the
plain price in the file). Counts as the record has them (the engine's usage, else counted
chunks); an engine that reports no input count costs its output alone.
"""

from __future__ import annotations

from llmobs.config.prices import Price
from llmobs.observe.slo import Verdict
from llmobs.observe.timing import RequestStats

PER = 1_000_000  # prices are per million tokens


def cost_verdict(verdict: Verdict | None) -> str:
    """The ``verdict`` label of a request's cost: good, bad, or none (judged in neither)."""
    return "none" if verdict is None else "good" if verdict.good else "bad"


def request_cost(price: Price | None, s: RequestStats) -> float | None:
    """The request's cost in the file's currency; None: its model has no price."""
    if price is None:
        return None
    given = s.input_tokens or 0
    cached = min(s.cached_tokens or 0, given)
    output = s.output_tokens
    reasoning = min(s.reasoning_tokens or 0, output)
    return (
        (given - cached) * price.input
        + cached * price.cached_input
        + (output - reasoning) * price.output
        + reasoning * price.reasoning
    ) / PER
