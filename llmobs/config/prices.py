"""Prices of tokens, per model, from the operator's price file (``--price-file``)::

    currency: USD
    prices:                         # per million tokens
      llama-3.1-8b:
        input: 0.10
        output: 0.20
        cached_input: 0.05          # optional: input's price when absent
        reasoning: 0.20             # optional: output's price when absent
      "*":                          # optional: any other model
        input: 0.50
        output: 1.50

A model matches its entry by the name the request sent (its label: the first ``--max-models``
names, then ``other``); ``*`` prices the rest; a model with neither has no cost. No price file,
no cost series. The cost arithmetic is observation's (``observe.cost``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmobs.config.options import ConfigError, read_yaml

ANY = "*"
_CURRENCY = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,15}")


@dataclass(frozen=True)
class Price:
    """One model's prices, per million tokens of each kind."""

    input: float
    output: float
    cached_input: float
    reasoning: float


@dataclass(frozen=True)
class Prices:
    """The price file: its currency and each model's prices (``*``: any other)."""

    currency: str = ""
    models: Mapping[str, Price] = field(default_factory=dict)

    def of(self, model: str) -> Price | None:
        """The prices of ``model`` (its label), or of any model; None: no cost."""
        return self.models.get(model) or self.models.get(ANY)


def _number(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ConfigError(f"{where}: expected a price (a number >= 0)")
    if raw < 0:
        raise ConfigError(f"{where}: a price must be >= 0, got {raw}")
    return float(raw)


def _price(raw: Any, where: str) -> Price:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected input and output prices")
    unknown = sorted(set(raw) - {"input", "output", "cached_input", "reasoning"})
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}")
    for needed in ("input", "output"):
        if needed not in raw:
            raise ConfigError(f"{where}: the {needed} price is missing")
    given = {k: _number(v, f"{where}.{k}") for k, v in raw.items()}
    return Price(
        given["input"],
        given["output"],
        given.get("cached_input", given["input"]),
        given.get("reasoning", given["output"]),
    )


def load_prices(path: str) -> Prices:
    """The price file; ``ConfigError`` naming the file and the entry for anything else."""
    where = f"--price-file {path}"
    loaded = read_yaml(path, "--price-file")
    if not isinstance(loaded, dict) or not isinstance(loaded.get("prices"), dict):
        raise ConfigError(f"{where}: expected 'currency:' and a mapping 'prices:'")
    currency = loaded.get("currency")
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise ConfigError(f"{where}: 'currency:' names one currency (USD, EUR, credits)")
    models = {
        str(model): _price(raw, f"{where}: prices.{model}")
        for model, raw in loaded["prices"].items()
    }
    return Prices(currency, models)
