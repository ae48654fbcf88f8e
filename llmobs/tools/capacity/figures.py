"""One load level's figures (pure): what its clients saw, summed up and judged.

Each request gives a ``Sample`` (times in seconds, on the client's clock); a level gives
its throughput over the measured window, the quantiles of TTFT, TPOT and the longest gap,
the goodput (requests and output tokens per second of requests within every bound), and
whether the objectives hold: the chosen quantile of each bounded quantity within its bound,
and no more requests failed than that quantile leaves out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

QUANTILES = (0.5, 0.9, 0.95, 0.99)
QUANTITIES = ("ttft", "tpot", "max_gap")  # what an objective may bound (seconds)
OVERLOADED = "overloaded"  # a request never sent: too many in flight already (drive)


@dataclass(frozen=True, slots=True)
class Sample:
    """What a client saw of one request: send and end times (its clock), TTFT, the gaps'
    times, output tokens; ``error``: why it failed (None: it did not)."""

    sent: float
    ended: float
    ttft: float | None
    chunk_times: tuple[float, ...]
    output_tokens: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (None: fewer than two tokens)."""
        if not self.ok or self.output_tokens < 2 or not self.chunk_times:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def max_gap(self) -> float | None:
        """The longest wait between two chunks (None: one chunk or none)."""
        times = self.chunk_times
        if not self.ok or len(times) < 2:
            return None
        return max(b - a for a, b in itertools.pairwise(times))

    def value(self, quantity: str) -> float | None:
        if quantity == "ttft":
            return self.ttft if self.ok else None
        return self.tpot if quantity == "tpot" else self.max_gap


@dataclass(frozen=True)
class Objectives:
    """Bounds (seconds) by quantity, held at ``quantile`` of the requests."""

    bounds: Mapping[str, float]
    quantile: float = 0.9

    def within(self, sample: Sample) -> bool:
        """Whether one request met every bound (a failed one met none)."""
        if not sample.ok:
            return False
        for quantity, bound in self.bounds.items():
            value = sample.value(quantity)
            if value is not None and value > bound:
                return False
        return True


@dataclass(frozen=True)
class Level:
    """One load level's figures; ``quantiles[quantity][q]`` in seconds."""

    load: float
    requests: int
    errors: int
    seconds: float
    throughput: float  # requests per second
    output_tps: float  # output tokens per second
    goodput: float  # requests per second within every bound
    good_tps: float  # their output tokens per second
    quantiles: dict[str, dict[float, float]] = field(default_factory=dict)
    misses: tuple[str, ...] = ()  # the quantities whose quantile broke its bound, "errors"
    judged: dict[str, float] = field(default_factory=dict)  # each bound's quantity at its q
    overloaded: int = 0  # requests never sent: too many in flight (a rate level)

    @property
    def holds(self) -> bool:
        return not self.misses

    @property
    def good_share(self) -> float:
        return self.goodput / self.throughput if self.throughput else 0.0


def quantiles(values: Sequence[float]) -> dict[float, float]:
    """The ``QUANTILES`` of ``values`` (linear interpolation, as numpy and aiperf take them)."""
    if not values:
        return {}
    found = np.quantile(np.asarray(values, dtype=float), QUANTILES)
    return {q: float(v) for q, v in zip(QUANTILES, found, strict=True)}


def quantile_of(values: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=float), q)) if values else math.nan


def judge(
    samples: Sequence[Sample], objectives: Objectives
) -> tuple[dict[str, float], tuple[str, ...]]:
    """Each bounded quantity's ``objectives.quantile`` and those that break their bound;
    ``errors`` among them when more requests failed than the quantile leaves out."""
    judged: dict[str, float] = {}
    out: list[str] = []
    for quantity, bound in objectives.bounds.items():
        values = [v for s in samples if (v := s.value(quantity)) is not None]
        if values:
            judged[quantity] = quantile_of(values, objectives.quantile)
            if judged[quantity] > bound:
                out.append(quantity)
    failed = sum(not s.ok for s in samples)
    if failed > round((1 - objectives.quantile) * len(samples), 9):  # 1 - 0.9 is 0.0999...
        out.append("errors")
    return judged, tuple(out)


def _rate(samples: Sequence[Sample], clients: int | None) -> float:
    """Requests per second, per request measured (the level's rate over its count).

    A closed loop of ``clients`` always has each of them waiting on one request: by Little's
    law its throughput is the clients over the mean response time, exact whatever the
    clients' phase (in step, a cohort's requests end together: their ends' spacing says
    nothing). Arrivals (None): n requests end over the n - 1 intervals between their ends."""
    if clients:
        mean = sum(s.ended - s.sent for s in samples) / len(samples)
        return clients / mean / len(samples) if mean > 0 else 0.0
    ends = sorted(s.ended for s in samples)
    span = ends[-1] - ends[0]
    return (len(ends) - 1) / span / len(ends) if span > 0 and len(ends) > 1 else 0.0


def level(
    load: float, samples: Sequence[Sample], objectives: Objectives, clients: int | None = None
) -> Level:
    """The figures of ``samples`` measured at ``load`` (``clients``: a closed loop's; None:
    arrivals at a rate)."""
    if not samples:
        return Level(load, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, misses=("no requests",))
    seconds = max(s.ended for s in samples) - min(s.sent for s in samples)
    per_s = _rate(samples, clients)
    good = [s for s in samples if objectives.within(s)]
    ok = [s for s in samples if s.ok]
    judged, missed = judge(samples, objectives)
    found = {}
    for quantity in QUANTITIES:
        values = [v for s in samples if (v := s.value(quantity)) is not None]
        if values:
            found[quantity] = quantiles(values)
    return Level(
        load=load,
        requests=len(samples),
        errors=len(samples) - len(ok),
        seconds=seconds,
        throughput=len(samples) * per_s,
        output_tps=sum(s.output_tokens for s in ok) * per_s,
        goodput=len(good) * per_s,
        good_tps=sum(s.output_tokens for s in good) * per_s,
        quantiles=found,
        misses=missed,
        judged=judged,
        overloaded=sum(s.error == OVERLOADED for s in samples),
    )
