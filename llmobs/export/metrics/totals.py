"""What the live page reads of the request series once a second: each model's totals.

A reader of the sink's families (``MetricsSink.families``), under their lock, as a scrape
is: nothing is kept twice for the page (``export.live`` turns the totals into points).
"""

from __future__ import annotations

from typing import Any

from llmobs.export.live import CAUSES, PHASES, ModelTotals
from llmobs.export.metrics.catalogue import (
    ACTIVE,
    COST,
    ITL,
    QUEUE_DEPTH,
    REQUESTS,
    SLO_OUTPUT_TOKENS,
    SLO_REQUESTS,
    STALLS,
    TOKENS,
    TTFT,
    TTFT_PHASE,
)
from llmobs.export.metrics.series import CounterFamily, Family, HistogramFamily
from llmobs.export.metrics.sink import MetricsSink


class _Rows:
    """Each model's totals as they are added up, every operation together."""

    def __init__(self, ttft: int, itl: int) -> None:
        self._ttft, self._itl = ttft, itl
        self.rows: dict[str, dict[str, Any]] = {}

    def row(self, model: str) -> dict[str, Any]:
        found = self.rows.get(model)
        if found is None:
            found = self.rows[model] = {
                "ttft": [0.0] * self._ttft, "itl": [0.0] * self._itl,
                "causes": [0.0] * len(CAUSES), "phases": [0.0] * len(PHASES),
            }  # fmt: skip
        return found

    def add(self, model: str, name: str, value: float) -> None:
        target = self.row(model)
        target[name] = target.get(name, 0.0) + value

    def buckets(self, family: HistogramFamily, name: str, width: int) -> None:
        """A histogram's bucket counts (``width`` of them: the buckets and +Inf)."""
        for key, series in family.series.items():  # (operation, model, [tenant])
            counts = self.row(key[1])[name]
            for i in range(width):
                counts[i] += series[i]


def live_totals(sink: MetricsSink) -> tuple[dict[str, ModelTotals], float, float]:
    """Each model's totals, every operation together, and the queue depth and active
    requests now: what the live page reads once a second (``live.LiveRing``)."""
    families = sink.families
    ttft, itl = _histogram(families[TTFT]), _histogram(families[ITL])
    phases = _histogram(families[TTFT_PHASE])
    rows = _Rows(ttft.size, itl.size)  # the buckets and +Inf, without the sum
    with sink.collector.lock:
        rows.buckets(ttft, "ttft", ttft.size)
        rows.buckets(itl, "itl", itl.size)
        # keys: (operation, model, [tenant,] its own labels): the model second, theirs last
        for key, value in _counter(families[STALLS]).series.items():
            rows.add(key[1], "stalls", value)
            rows.row(key[1])["causes"][CAUSES.index(key[-1])] += value
        for key, series in phases.series.items():
            rows.row(key[1])["phases"][PHASES.index(key[-1])] += series[phases.size]  # its sum
        for key, value in _counter(families[TOKENS]).series.items():
            if key[-2] == "output":
                rows.add(key[1], "tokens", value)
        for key, value in _counter(families[REQUESTS]).series.items():
            rows.add(key[1], "requests", value)
        for key, value in _counter(families[SLO_REQUESTS]).series.items():
            rows.add(key[1], key[-1], value)
        for key, value in _counter(families[SLO_OUTPUT_TOKENS]).series.items():
            if key[-1] == "good":
                rows.add(key[1], "good_tokens", value)
        cost = families.get(COST)
        if cost is not None:  # (operation, model, [tenant,] verdict, currency)
            for name in rows.rows:
                rows.row(name).setdefault("cost", 0.0)
            for key, value in _counter(cost).series.items():
                rows.add(key[1], "cost", value)
        queue = _counter(families[QUEUE_DEPTH]).series[()]
        active = _counter(families[ACTIVE]).series[()]
    return {model: ModelTotals(**found) for model, found in rows.rows.items()}, queue, active


def _histogram(family: Family) -> HistogramFamily:
    assert isinstance(family, HistogramFamily)
    return family


def _counter(family: Family) -> CounterFamily:
    assert isinstance(family, CounterFamily)
    return family
