"""What the live page reads of the request series once a second: each model's totals.

A reader of the sink's families (``MetricsSink.families``), under their lock, as a scrape
is: nothing is kept twice for the page (``export.live`` turns the totals into points).
"""

from __future__ import annotations

from typing import Any

from llmobs.export.live import ModelTotals
from llmobs.export.metrics.catalogue import (
    ACTIVE,
    ITL,
    QUEUE_DEPTH,
    REQUESTS,
    SLO_OUTPUT_TOKENS,
    SLO_REQUESTS,
    STALLS,
    TOKENS,
    TTFT,
)
from llmobs.export.metrics.series import CounterFamily, Family, HistogramFamily
from llmobs.export.metrics.sink import MetricsSink


def live_totals(sink: MetricsSink) -> tuple[dict[str, ModelTotals], float, float]:
    """Each model's totals, every operation together, and the queue depth and active
    requests now: what the live page reads once a second (``live.LiveRing``)."""
    families = sink.families
    ttft, itl = _histogram(families[TTFT]), _histogram(families[ITL])
    stalls, tokens = _counter(families[STALLS]), _counter(families[TOKENS])
    requests, slo_requests = _counter(families[REQUESTS]), _counter(families[SLO_REQUESTS])
    slo_tokens = _counter(families[SLO_OUTPUT_TOKENS])
    queue_depth, active_now = _counter(families[QUEUE_DEPTH]), _counter(families[ACTIVE])
    width = ttft.size  # the buckets and +Inf, without the sum
    rows: dict[str, dict[str, Any]] = {}

    def row(model: str) -> dict[str, Any]:
        found = rows.get(model)
        if found is None:
            found = rows[model] = {"ttft": [0.0] * width, "itl": [0.0] * itl.size}
        return found

    def add(target: dict[str, Any], name: str, value: float) -> None:
        target[name] = target.get(name, 0.0) + value

    with sink.collector.lock:
        for (_, model), series in ttft.series.items():
            counts = row(model)["ttft"]
            for i in range(width):
                counts[i] += series[i]
        for (_, model), series in itl.series.items():
            counts = row(model)["itl"]
            for i in range(itl.size):
                counts[i] += series[i]
        for (_, model, _), value in stalls.series.items():
            add(row(model), "stalls", value)
        for (_, model, kind, _), value in tokens.series.items():
            if kind == "output":
                add(row(model), "tokens", value)
        for (_, model, *_), value in requests.series.items():
            add(row(model), "requests", value)
        for (_, model, verdict), value in slo_requests.series.items():
            add(row(model), verdict, value)
        for (_, model, verdict), value in slo_tokens.series.items():
            if verdict == "good":
                add(row(model), "good_tokens", value)
        queue, active = queue_depth.series[()], active_now.series[()]
    return {model: ModelTotals(**found) for model, found in rows.items()}, queue, active


def _histogram(family: Family) -> HistogramFamily:
    assert isinstance(family, HistogramFamily)
    return family


def _counter(family: Family) -> CounterFamily:
    assert isinstance(family, CounterFamily)
    return family
