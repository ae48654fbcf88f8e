"""The classic histograms' bucket bounds, where the operator sets them (``--buckets``)::

    --buckets 'ttft=0.1,0.25,0.5,1,2,5;itl=0.01,0.02,0.05,0.1,0.25'

For a Prometheus that keeps no native histograms, whose quantiles are only as good as the
buckets around them: a TTFT objective of 800 ms wants a bound at 0.8. Each list ascending,
positive, at most ``MAX_BUCKETS`` bounds (``+Inf`` is always added); the families not named
keep the catalogue's. The native histograms are not affected (their buckets are exponential).
"""

from __future__ import annotations

import itertools
import math

# the families --buckets can name (the catalogue's BUCKET_METRICS maps them)
FAMILIES = ("ttft", "phases", "tpot", "duration", "itl")
MAX_BUCKETS = 64

Buckets = tuple[tuple[str, tuple[float, ...]], ...]  # (family, bounds), in FAMILIES' order


def parse_buckets(text: str) -> Buckets:
    """``family=b1,b2,...;family=...`` into (family, bounds) pairs; ``ValueError`` saying
    what is wrong (the option machinery names the flag)."""
    found: dict[str, tuple[float, ...]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, values = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in FAMILIES:
            raise ValueError(f"expected family=b1,b2,... with a family of {', '.join(FAMILIES)}")
        if name in found:
            raise ValueError(f"{name} is given twice")
        found[name] = _bounds(name, values)
    return tuple((name, found[name]) for name in FAMILIES if name in found)


def _bounds(name: str, values: str) -> tuple[float, ...]:
    try:
        bounds = tuple(float(v) for v in values.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name}: bounds are numbers of seconds, such as 0.5") from None
    if not bounds or len(bounds) > MAX_BUCKETS:
        raise ValueError(f"{name}: between 1 and {MAX_BUCKETS} bounds")
    if not all(math.isfinite(b) and b > 0 for b in bounds):
        raise ValueError(f"{name}: bounds must be finite and above 0 (+Inf is added)")
    if any(b >= c for b, c in itertools.pairwise(bounds)):
        raise ValueError(f"{name}: bounds must be strictly ascending")
    return bounds
