"""Read a registry the way PromQL would: sums over series and ``histogram_quantile``.

The demo's summary and the tests read the sidecar's own exposition through this, so what they
report is what a Grafana panel on the same metrics would show.
"""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client import CollectorRegistry


def total(registry: CollectorRegistry, sample: str, **labels: str) -> float:
    """Sum of all samples named ``sample`` whose labels include ``labels``."""
    value = 0.0
    for family in registry.collect():
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                value += s.value
    return value


def buckets(registry: CollectorRegistry, family: str, **labels: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` of histogram ``family`` summed over matching series."""
    sums: dict[float, float] = defaultdict(float)
    for fam in registry.collect():
        for s in fam.samples:
            if s.name != family + "_bucket":
                continue
            if all(s.labels.get(k) == v for k, v in labels.items()):
                sums[float(s.labels["le"])] += s.value
    return sorted(sums.items())


def quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """Prometheus ``histogram_quantile``: linear interpolation inside the bucket."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    count = cumulative[-1][1]
    rank = q * count
    prev_le, prev_count = 0.0, 0.0
    for le, c in cumulative:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # beyond the last finite bucket, like Prometheus
            if c == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (c - prev_count)
        prev_le, prev_count = le, c
    return prev_le
