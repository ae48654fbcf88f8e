"""Request series with odd labels and values (quotes, backslashes, newlines, non-ASCII, empty,
long; negative buckets, float counts, huge and tiny numbers): what each encoder
(``export.metrics.text``, ``openmetrics``) and the /metrics renderer are held to
prometheus_client's writers on, byte for byte."""

from __future__ import annotations

import numpy as np

from llmobs.export.metrics.catalogue import ITL, ITL_SQUARES, REQUESTS, TTFT, Kind, MetricDef
from llmobs.export.metrics.series import (
    CounterFamily,
    HistogramFamily,
    SeriesCollector,
    TokenHistogram,
)
from llmobs.observe.window import ArrayWindow, TokenWindow
from tests.support.recording import observe

ODD = [
    "plain",
    'quo"te',
    "back\\slash",
    "new\nline",
    'all \\" \n \\n of them',
    "unicodé ✓ 模型 🚀",
    "",
    "le",
    "x" * 300,
]
# A histogram with a label sorting after "le", a negative first bucket (no _count, _sum) and a
# description needing escapes.
ODD_HISTOGRAM = MetricDef(
    "odd.histogram", Kind.HISTOGRAM, "s", "back\\slash and\nnewline",
    ("a.label", "zone"), (-1.0, 0.5, 1e-7, 123456789.0),
)  # fmt: skip
ODD_COUNTER = MetricDef("odd.counter", Kind.COUNTER, "1", "no labels \\ here", ())


def window(gaps: list[float], weights: list[int]) -> TokenWindow:
    """A window of ``gaps`` (seconds), each counted ``weights`` times."""
    itl, w = np.asarray(gaps, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    return ArrayWindow(
        itl, w, 0, None, tokens=float(w.sum()), itl_sum=float((itl * w).sum()),
        itl_sumsq=float((itl * itl * w).sum()),
    )  # fmt: skip


def odd_collector() -> tuple[SeriesCollector, list[HistogramFamily | CounterFamily]]:
    """A collector of every kind of family, each series under odd label values; its families
    in order: TTFT, the odd histogram, requests, an empty one, a gauge, a counter, the ITL's
    histogram and its squares."""
    ttft = HistogramFamily(TTFT)
    odd = HistogramFamily(ODD_HISTOGRAM)
    requests = CounterFamily(REQUESTS)
    gauge = CounterFamily(ODD_COUNTER, gauge=True)
    counter = CounterFamily(ODD_COUNTER)
    itl = TokenHistogram(ITL, ITL_SQUARES)
    empty = HistogramFamily(ITL)  # never recorded into: left out
    families: list[HistogramFamily | CounterFamily] = [ttft, odd, requests, empty, gauge]
    families += [counter, itl.histogram, itl.squares]
    collector = SeriesCollector(families)
    for i, value in enumerate(ODD):
        other = ODD[-1 - i]
        observe(ttft, (value, other), 0.01 * i)
        observe(ttft, (value, other), 0.3)
        observe(odd, (value, other), -3.0)
        observe(odd, (value, other), 1e9 * (i + 1))
        requests.add((value, other, "ok", "2xx", value), 10**i)
        itl.record((value, other), window([0.02, 0.004, 1.5 * i], [1, 3, 2]))
    gauge.add((), -5)
    counter.add((), 2.5e-9)
    return collector, families
