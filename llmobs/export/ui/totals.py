"""What the live page reads of the request series once a second: each model's totals.

A reader of the sink's families (``MetricsSink.families``), under their lock, as a scrape
is, through the families' own API (``sum_by``: series added up by the values of named
labels), so it knows the catalogue's labels and nothing of how a series is stored; nothing
is kept twice for the page (``export.live`` turns the totals into points).
"""

from __future__ import annotations

from typing import Any

from llmobs.export.live import CAUSES, PHASES, ModelTotals
from llmobs.export.metrics.catalogue import (
    ACTIVE,
    CAUSE,
    COST,
    ITL,
    MODEL,
    PHASE,
    QUEUE_DEPTH,
    REQUESTS,
    SLO_OUTPUT_TOKENS,
    SLO_REQUESTS,
    STALLS,
    TOKEN_TYPE,
    TOKENS,
    TTFT,
    TTFT_PHASE,
    VERDICT,
    MetricDef,
)
from llmobs.export.metrics.series import CounterFamily, Family, HistogramFamily
from llmobs.export.metrics.sink import MetricsSink

Sums = dict[tuple[str, ...], float]


def live_totals(sink: MetricsSink) -> tuple[dict[str, ModelTotals], float, float]:
    """Each model's totals, every operation together, and the queue depth and active
    requests now: what the live page reads once a second (``live.LiveRing``)."""
    families = sink.families
    with sink.collector.lock:
        rows = _histograms(families)
        _counters(families, rows)
        queue = _counter(families, QUEUE_DEPTH).series[()]
        active = _counter(families, ACTIVE).series[()]
    return {model: ModelTotals(**found) for model, found in rows.items()}, queue, active


def _histograms(families: dict[MetricDef, Family]) -> dict[str, dict[str, Any]]:
    """Each model's row: its TTFT and ITL bucket counts (+Inf's last), its TTFT spent in
    each phase (the phase histogram's sums), zeros for what the counters add."""
    ttft, itl = _histogram(families, TTFT), _histogram(families, ITL)
    rows: dict[str, dict[str, Any]] = {}

    def row(model: str) -> dict[str, Any]:
        found = rows.get(model)
        if found is None:
            found = rows[model] = {
                "ttft": [0.0] * ttft.size, "itl": [0.0] * itl.size,
                "causes": [0.0] * len(CAUSES), "phases": [0.0] * len(PHASES),
            }  # fmt: skip
        return found

    for name, family in (("ttft", ttft), ("itl", itl)):
        for (model,), series in family.sum_by((MODEL,)).items():
            row(model)[name] = [float(n) for n in series[: family.size]]  # not the sum
    phases = _histogram(families, TTFT_PHASE)
    for (model, phase), series in phases.sum_by((MODEL, PHASE)).items():
        row(model)["phases"][PHASES.index(phase)] += series[phases.size]  # its sum
    for (model, cause), value in _counter(families, STALLS).sum_by((MODEL, CAUSE)).items():
        row(model)["causes"][CAUSES.index(cause)] += value
    for metric in (REQUESTS, SLO_REQUESTS, TOKENS, SLO_OUTPUT_TOKENS, COST):
        if metric in families:  # (the models every counter has, in the order they came)
            for (model,) in _counter(families, metric).sum_by((MODEL,)):
                row(model)
    return rows


def _counters(families: dict[MetricDef, Family], rows: dict[str, dict[str, Any]]) -> None:
    """Each model's stalls, output tokens, requests, good and bad requests, good tokens and
    (with a price file) cost."""
    totals: list[tuple[str, Sums]] = [
        ("stalls", _sums(families, STALLS, ())),
        ("requests", _sums(families, REQUESTS, ())),
        ("tokens", _where(_sums(families, TOKENS, (TOKEN_TYPE,)), "output")),
        ("good_tokens", _where(_sums(families, SLO_OUTPUT_TOKENS, (VERDICT,)), "good")),
    ]
    for verdict in ("good", "bad"):
        totals.append((verdict, _where(_sums(families, SLO_REQUESTS, (VERDICT,)), verdict)))
    if COST in families:
        totals.append(("cost", _sums(families, COST, ())))
        for found in rows.values():
            found.setdefault("cost", 0.0)
    for name, sums in totals:
        for (model,), value in sums.items():
            found = rows[model]
            found[name] = found.get(name, 0.0) + value


def _sums(families: dict[MetricDef, Family], metric: MetricDef, by: tuple[str, ...]) -> Sums:
    """A counter's series added up by model and ``by``'s labels."""
    return _counter(families, metric).sum_by((MODEL, *by))


def _where(sums: Sums, value: str) -> Sums:
    """The sums whose last label is ``value``, by model."""
    return {key[:1]: total for key, total in sums.items() if key[-1] == value}


def _histogram(families: dict[MetricDef, Family], metric: MetricDef) -> HistogramFamily:
    family = families[metric]
    assert isinstance(family, HistogramFamily)
    return family


def _counter(families: dict[MetricDef, Family], metric: MetricDef) -> CounterFamily:
    family = families[metric]
    assert isinstance(family, CounterFamily)
    return family
