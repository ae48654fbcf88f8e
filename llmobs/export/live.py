"""The live page's data: a ring of one point per second, made from the sidecar's own totals.

Nothing per chunk or per request: once a second the sidecar reads the totals it keeps anyway
(the sink's series, the collectors' last readings) and ``LiveRing.add`` turns what changed
since the second before into one point: TTFT quantiles over the last ``QUANTILE_WINDOW_S``
seconds, output tokens per second split by the gap before each token (the stutter made
visible), stalls per second, requests, the queue, SLO attainment and goodput, the engine's and
the GPU's gauges. Pure: the clock and the totals are passed in.

Bounded memory: one ``array('d')`` of ``len(GLOBAL) + MODEL_SLOTS * len(PER_MODEL)`` = 241
numbers per second (1,928 bytes, ~2 KB with the array's header), ``seconds`` of them (600
by default: ~1.2 MB); the first ``MODEL_SLOTS - 1`` models seen get a slot of their own, and all
of them are in ``all``.
"""

from __future__ import annotations

import enum
import math
import threading
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from llmobs.export.metrics.query import quantile
from llmobs.observe.causes import STALL_CAUSES
from llmobs.observe.phases import Phase

ALL = "all"  # every model together
MODEL_SLOTS = 9  # "all" and up to 8 models
QUANTILE_WINDOW_S = 10  # TTFT quantiles: over the requests of the last 10 s
SLO_WINDOW_S = 60  # attainment: over the judged requests of the last minute
# ITL bands (seconds, upper edges): output tokens per second by the gap before them
ITL_BANDS = (0.05, 0.1, 0.25)
BAND_NAMES = ("itl_le_50ms", "itl_50_100ms", "itl_100_250ms", "itl_gt_250ms")
# why it was slow: stalls per second by cause, and the mean request's TTFT by phase over
# the last QUANTILE_WINDOW_S (observe.causes, observe.phases)
CAUSES = tuple(cause.value for cause in STALL_CAUSES)
PHASES = tuple(phase.value for phase in Phase)
CAUSE_NAMES = tuple(f"stalls_{cause}" for cause in CAUSES)
PHASE_NAMES = tuple(f"ttft_{phase}" for phase in PHASES)
PER_MODEL = (
    "ttft_p50", "ttft_p95", "ttft_p99", *BAND_NAMES, "stalls", "tokens", "requests",
    "attainment", "goodput", *CAUSE_NAMES, *PHASE_NAMES, "cost",
)  # fmt: skip


class Gauge(enum.StrEnum):
    """A collector's number the page shows, by the name it has in ``Totals.gauges`` and in
    the data: defined here, where the collectors that read them can import it."""

    ENGINE_WAITING = "engine_waiting"
    ENGINE_RUNNING = "engine_running"
    ENGINE_KV_CACHE = "engine_kv_cache"
    GPU_MEMORY_USED = "gpu_memory_used"
    GPU_BANDWIDTH = "gpu_bandwidth"


GLOBAL = ("queue", "active", *(gauge.value for gauge in Gauge))
# where the page reads the gauges from (the assembly passes ``Collectors.live_gauges``): a
# shape export defines, so that it never imports the collectors, which import it
GaugeSource = Callable[[], Mapping[str, float]]
NAN = math.nan


@dataclass(frozen=True)
class ModelTotals:
    """One model's totals since the start, as the sink keeps them: per-bucket counts of TTFT
    and ITL (not cumulative, ``+Inf`` last), stalls, output tokens, requests, and the SLO's
    good and bad requests and good output tokens."""

    ttft: Sequence[float] = ()
    itl: Sequence[float] = ()
    stalls: float = 0.0
    tokens: float = 0.0
    requests: float = 0.0
    good: float = 0.0
    bad: float = 0.0
    good_tokens: float = 0.0
    causes: Sequence[float] = (0.0,) * len(CAUSES)  # stalls by cause, in ``CAUSES``' order
    phases: Sequence[float] = (0.0,) * len(PHASES)  # seconds of TTFT by phase, in this order
    cost: float | None = None  # what the tokens cost, in the price file's (None: no file)


@dataclass(frozen=True)
class Totals:
    """What the sidecar reads once a second: the models' totals, the queue and active
    requests now, and whichever ``Gauge`` the collectors have (others absent)."""

    models: Mapping[str, ModelTotals]
    queue: float = 0.0
    active: float = 0.0
    gauges: Mapping[str, float] = field(default_factory=dict)


def _minus(a: Sequence[float], b: Sequence[float]) -> list[float]:
    if len(b) != len(a):  # the first reading of a model: everything is new
        return list(a)
    return [max(x - y, 0.0) for x, y in zip(a, b, strict=True)]


def _sum(rows: Sequence[Sequence[float]]) -> list[float]:
    width = max((len(r) for r in rows), default=0)
    out = [0.0] * width
    for row in rows:
        for i, v in enumerate(row):
            out[i] += v
    return out


class _Model:
    """What one slot remembers between seconds: the last totals and recent changes."""

    __slots__ = ("last", "phases", "slo", "ttft")

    def __init__(self) -> None:
        self.last = ModelTotals()
        self.ttft: deque[list[float]] = deque(maxlen=QUANTILE_WINDOW_S)
        self.phases: deque[list[float]] = deque(maxlen=QUANTILE_WINDOW_S)
        self.slo: deque[tuple[float, float]] = deque(maxlen=SLO_WINDOW_S)


class LiveRing:
    """The last ``seconds`` points; ``add`` one per second, ``data`` for the page, with the
    price file's ``currency`` (the cost chart's unit; "" without one)."""

    def __init__(
        self,
        ttft_bounds: Sequence[float],
        itl_bounds: Sequence[float],
        seconds: int = 600,
        currency: str = "",
    ) -> None:
        self.seconds = seconds
        self.currency = currency
        self._ttft_bounds = (*ttft_bounds, math.inf)
        # for each ITL bucket (+Inf last), the band it falls in
        edges = (*itl_bounds, math.inf)
        self._band = [next(i for i, e in enumerate(ITL_BANDS) if b <= e)
                      if b <= ITL_BANDS[-1] else len(ITL_BANDS) for b in edges]  # fmt: skip
        self.models: list[str] = [ALL]  # slot order
        self._state: dict[str, _Model] = {ALL: _Model()}
        self.times: deque[float] = deque(maxlen=seconds)
        self.points: deque[array[float]] = deque(maxlen=seconds)
        self.objectives = False  # an SLO judged some request: the page shows attainment
        # ``data`` may run in a worker thread (a page opened on a full ring): it copies the
        # points under this lock, ``add`` appends under it
        self._lock = threading.Lock()

    def add(self, now: float, totals: Totals) -> None:
        """One second's point from ``totals`` (read at ``now``, unix seconds)."""
        point = array("d", [NAN]) * (len(GLOBAL) + MODEL_SLOTS * len(PER_MODEL))
        readings = {"queue": totals.queue, "active": totals.active, **totals.gauges}
        for i, name in enumerate(GLOBAL):
            point[i] = readings.get(name, NAN)
        models = dict(totals.models)
        for name in models:
            if name not in self._state and len(self.models) < MODEL_SLOTS:
                self.models.append(name)
                self._state[name] = _Model()
        every = list(models.values())
        fields = ("stalls", "tokens", "requests", "good", "bad", "good_tokens")
        counts = {f: sum(getattr(m, f) for m in every) for f in fields}
        costs = [m.cost for m in every if m.cost is not None]
        models[ALL] = ModelTotals(
            ttft=_sum([m.ttft for m in every]), itl=_sum([m.itl for m in every]), **counts,
            causes=_sum([m.causes for m in every]), phases=_sum([m.phases for m in every]),
            cost=sum(costs) if costs else None,
        )  # fmt: skip
        for slot, name in enumerate(self.models):
            found = models.get(name)
            if found is not None:
                self._model(point, len(GLOBAL) + slot * len(PER_MODEL), name, found)
        with self._lock:
            self.times.append(now)
            self.points.append(point)

    def count_since(self, since: float) -> int:
        """How many points ``data(since)`` would return."""
        count = 0
        for t in reversed(self.times):  # newest first: a poll's few points, then it stops
            if t <= since:
                break
            count += 1
        return count

    def _model(self, point: array[float], at: int, name: str, now: ModelTotals) -> None:
        """Write ``PER_MODEL``'s values of one model's second into ``point`` from ``at``
        (by name: a new series is a name in ``PER_MODEL`` and its value here)."""
        state = self._state[name]
        last, state.last = state.last, now
        state.ttft.append(_minus(now.ttft, last.ttft))
        cumulative, running = [], 0.0
        for le, count in zip(self._ttft_bounds, _sum(list(state.ttft)), strict=False):
            running += count
            cumulative.append((le, running))
        values: dict[str, float] = {}
        for field_name, q in (("ttft_p50", 0.5), ("ttft_p95", 0.95), ("ttft_p99", 0.99)):
            found = quantile(q, cumulative)
            values[field_name] = NAN if found is None else found
        bands = [0.0] * len(BAND_NAMES)
        for band, count in zip(self._band, _minus(now.itl, last.itl), strict=False):
            bands[band] += count
        values.update(zip(BAND_NAMES, bands, strict=True))
        for field_name in ("stalls", "tokens", "requests"):
            values[field_name] = max(getattr(now, field_name) - getattr(last, field_name), 0.0)
        if now.cost is not None:  # a price file: what this second's tokens cost
            values["cost"] = max(now.cost - (last.cost or 0.0), 0.0)
        values.update(zip(CAUSE_NAMES, _minus(now.causes, last.causes), strict=False))
        self._phases(state, now, last, values)
        values["goodput"] = max(now.good_tokens - last.good_tokens, 0.0)
        state.slo.append((max(now.good - last.good, 0.0), max(now.bad - last.bad, 0.0)))
        judged = sum(g + b for g, b in state.slo)
        if judged:
            self.objectives = True
            values["attainment"] = sum(g for g, _ in state.slo) / judged
        for j, field_name in enumerate(PER_MODEL):
            point[at + j] = values.get(field_name, NAN)

    @staticmethod
    def _phases(
        state: _Model, now: ModelTotals, last: ModelTotals, values: dict[str, float]
    ) -> None:
        """The mean request's TTFT by phase over the window: each phase's seconds over the
        first tokens in it (none: no value)."""
        state.phases.append(_minus(now.phases, last.phases))
        firsts = sum(sum(counts) for counts in state.ttft)
        if firsts:
            seconds = _sum(list(state.phases))
            values.update((name, s / firsts) for name, s in zip(PHASE_NAMES, seconds, strict=False))

    def data(self, since: float = 0.0) -> dict[str, Any]:
        """The points after ``since`` as columns, for the page: ``t``, the global series, and
        each model's series under its name (``None`` where there is no value)."""
        with self._lock:
            times, points, models = list(self.times), list(self.points), list(self.models)
        start = next((i for i, t in enumerate(times) if t > since), len(times))
        rows = points[start:]
        width = len(GLOBAL) + MODEL_SLOTS * len(PER_MODEL)
        # one matrix, rounded at once (a value at a time took several times as long on a whole
        # ring: docs/benchmarks.md, "The live page"); None where a value is NaN
        matrix = np.round(np.frombuffer(b"".join(rows), dtype=np.float64), 6)
        matrix = matrix.reshape(len(rows), width).T.astype(object)
        matrix[matrix != matrix] = None  # noqa: PLR0124 - NaN is the value not equal to itself
        columns: list[list[float | None]] = [[] for _ in range(width)]
        if rows:  # (an object array's lists: floats, and None where NaN was)
            columns = cast("list[list[float | None]]", matrix.tolist())
        by_model = {
            name: {
                f: columns[len(GLOBAL) + slot * len(PER_MODEL) + j] for j, f in enumerate(PER_MODEL)
            }
            for slot, name in enumerate(models)
        }
        return {
            "t": times[start:],
            "global": {name: columns[i] for i, name in enumerate(GLOBAL)},
            "models": by_model,
            "objectives": self.objectives,
            "seconds": self.seconds,
            "currency": self.currency,
        }
