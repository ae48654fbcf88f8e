"""``llmobs slo --baseline``'s figures (pure): a run's latencies against a stored baseline's,
with a noise band taken from the baseline's own repeated runs.

A run is what one sidecar counted (since it started, or over a Prometheus window): the mean
TTFT, TPOT, ITL and duration (exact: a histogram's sum over its count), the p90 and p99 of
TTFT and TPOT (interpolated inside the histogram's buckets, as ``histogram_quantile``), the
share of requests that failed, and the workload's fingerprint (models, mean input and output
tokens per request). A baseline is several runs of the same workload on the build compared
against. Each quantity's band is the upper bound of a one-sided 99.9 % prediction interval
for one more run: mean + t(0.999, n - 1) x sd x sqrt(1 + 1/n), never narrower than what
can be resolved: ``FLOOR`` of the mean (the host's jitter), and for a quantile the width
of the bucket it fell in (a histogram cannot place a quantile closer; the means, exact,
see a shift inside it). It is a resolution, not a tolerance: runs that vary widen it. A run
regresses when a quantity is above its band; it is not comparable when its workload differs
or it holds too few requests.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmobs.export.metrics.catalogue import DURATION, ITL, REQUESTS, TOKENS, TPOT, TTFT
from llmobs.export.metrics.query import quantile
from llmobs.tools.slo.samples import MODEL, Sample

KIND = "llmobs-baseline"
MIN_RUNS = 3  # fewer cannot say how much a run varies
MIN_REQUESTS = 20  # a run with fewer has no quantile worth comparing
WORKLOAD_TOLERANCE = 0.05  # mean tokens per request further apart: another workload
# the narrowest band, as a share of the mean: a host's jitter between runs that a few quiet
# runs do not show (docs/benchmarks.md: an unchanged run came out 1.6 % slower than five
# quiet baseline runs 0.16 % apart)
FLOOR = 0.03
ERROR_FLOOR = 0.01  # ... and for the error share, in absolute terms (one request in 100)
# one-sided 99.9 % Student t by degrees of freedom (between rows: the row below, a wider band)
_T999 = {
    1: 318.31, 2: 22.327, 3: 10.215, 4: 7.173, 5: 5.893, 6: 5.208, 7: 4.785, 8: 4.501,
    9: 4.297, 10: 4.144, 11: 4.025, 12: 3.930, 13: 3.852, 14: 3.787, 15: 3.733, 16: 3.686,
    17: 3.646, 18: 3.610, 19: 3.579, 20: 3.552, 25: 3.450, 30: 3.385, 40: 3.307, 60: 3.232,
    120: 3.160,
}  # fmt: skip

_HISTOGRAMS = {"ttft": TTFT.prometheus, "tpot": TPOT.prometheus, "itl": ITL.prometheus,
               "duration": DURATION.prometheus}  # fmt: skip
_QUANTILES = {"ttft": (0.9, 0.99), "tpot": (0.9, 0.99)}
_REQUESTS, _TOKENS = REQUESTS.prometheus, TOKENS.prometheus
_LEFT = "client_disconnect"  # the outcome of a request whose client left (observe.timing)
UNITS = {"error_share": ""}  # every other quantity is in seconds


class NotComparable(Exception):
    """The run and the baseline cannot be compared (exit 2): the message says why."""


@dataclass(frozen=True)
class Run:
    """One run's figures: ``values`` by quantity, and its workload's fingerprint."""

    values: Mapping[str, float]
    requests: float
    models: tuple[str, ...]
    input_tokens: float | None  # mean per request (None: the engine reported no usage)
    output_tokens: float
    resolution: Mapping[str, float] = field(default_factory=dict)  # a quantile's bucket width

    def to_json(self) -> dict[str, Any]:
        return {"values": dict(self.values), "requests": self.requests,
                "models": list(self.models), "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "resolution": dict(self.resolution)}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        return cls({str(k): float(v) for k, v in data["values"].items()},
                   float(data["requests"]), tuple(str(m) for m in data["models"]),
                   None if data["input_tokens"] is None else float(data["input_tokens"]),
                   float(data["output_tokens"]),
                   {str(k): float(v) for k, v in data.get("resolution", {}).items()})  # fmt: skip


def queries(window: str) -> dict[str, str]:
    """The sample names a run is read from, each as PromQL summed over ``window``."""
    out: dict[str, str] = {}
    for family in _HISTOGRAMS.values():
        out[family + "_bucket"] = f"sum by (le) (increase({family}_bucket[{window}]))"
        for part in ("_sum", "_count"):
            out[family + part] = f"sum(increase({family}{part}[{window}]))"
    out[_REQUESTS] = f"sum by ({MODEL}, outcome) (increase({_REQUESTS}[{window}]))"
    out[_TOKENS] = f"sum by (gen_ai_token_type) (increase({_TOKENS}[{window}]))"
    return out


def _total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    out = 0.0
    for sample_name, sample_labels, value in samples:
        matches = all(sample_labels.get(k) == v for k, v in labels.items())
        if sample_name == name and math.isfinite(value) and matches:
            out += value
    return out


def _cumulative(samples: Iterable[Sample], family: str) -> list[tuple[float, float]]:
    sums: dict[float, float] = {}
    for name, labels, value in samples:
        if name == family + "_bucket" and "le" in labels and math.isfinite(value):
            le = float(labels["le"])
            sums[le] = sums.get(le, 0.0) + value
    return sorted(sums.items())


def bucket_width(cumulative: Sequence[tuple[float, float]], value: float) -> float:
    """The width of the bucket ``value`` falls in (upper bounds ``cumulative``'s; the first
    starts at 0); 0 beyond the last finite one."""
    low = 0.0
    for le, _ in cumulative:
        if value <= le:
            return le - low if math.isfinite(le) else 0.0
        low = le
    return 0.0


def run_of(samples: Sequence[Sample]) -> Run:
    """The run the samples describe; ``NotComparable`` when they hold no request."""
    # a client that left is the client's doing, not the build's (the SLO leaves it out too)
    requests = _total(samples, _REQUESTS) - _total(samples, _REQUESTS, outcome=_LEFT)
    if requests <= 0:
        raise NotComparable("no request counted: send the run's load through the sidecar first")
    values: dict[str, float] = {}
    resolution: dict[str, float] = {}
    for name, family in _HISTOGRAMS.items():
        count = _total(samples, family + "_count")
        if count > 0:
            values[f"{name}_mean"] = _total(samples, family + "_sum") / count
        cumulative = _cumulative(samples, family)
        for q in _QUANTILES.get(name, ()):
            found = quantile(q, cumulative)
            if found is not None:
                values[f"{name}_p{q * 100:g}"] = found
                resolution[f"{name}_p{q * 100:g}"] = bucket_width(cumulative, found)
    values["error_share"] = 1 - _total(samples, _REQUESTS, outcome="ok") / requests
    ok = _total(samples, _REQUESTS, outcome="ok")
    inputs = _total(samples, _TOKENS, gen_ai_token_type="input")
    if ok <= 0:  # every request failed: no lengths to compare, the error share says it all
        return Run(values, requests, (), None, math.nan, resolution)
    models = sorted({ls[MODEL] for n, ls, v in samples if n == _REQUESTS and v > 0 and MODEL in ls})
    return Run(values, requests, tuple(models), inputs / ok if inputs > 0 else None,
               _total(samples, _TOKENS, gen_ai_token_type="output") / ok, resolution)  # fmt: skip


def _t999(df: int) -> float:
    """The one-sided 99.9 % Student t for ``df`` degrees of freedom (the next lower row of
    the table: a wider band, never a narrower one); infinite with none."""
    if df < 1:
        return math.inf
    return _T999[max(k for k in _T999 if k <= df)]


@dataclass(frozen=True)
class Band:
    """A quantity's baseline: its runs' mean and spread, and the highest value that is noise."""

    mean: float
    sd: float
    upper: float


def band(values: Sequence[float], quantity: str = "", resolution: float = 0.0) -> Band:
    """The upper bound of a one-sided 99.9 % prediction interval for one more run, no
    narrower than ``resolution`` (or the floor of ``quantity``'s kind)."""
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else 0.0
    if n < 2:
        return Band(mean, sd, math.inf)
    relative = ERROR_FLOOR if quantity == "error_share" else FLOOR * abs(mean)
    floor = max(relative, resolution)
    return Band(mean, sd, mean + max(_t999(n - 1) * sd * math.sqrt(1 + 1 / n), floor))


@dataclass
class Baseline:
    """Runs of one workload on the build compared against (``llmobs slo --record-baseline``)."""

    runs: list[Run] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"kind": KIND, "version": 1,
                           "runs": [r.to_json() for r in self.runs]}, indent=2)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Baseline:
        """``ValueError`` when the text is not a baseline file."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError(f"not an {KIND} file")
        try:
            return cls([Run.from_json(r) for r in data["runs"]])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"a run in it lacks {exc}") from None

    def bands(self) -> dict[str, Band]:
        quantities = set.intersection(*(set(r.values) for r in self.runs))
        # the error share resolves one request of the smallest run: one failure is not a trend
        one = 1 / min(r.requests for r in self.runs)
        return {
            q: band([r.values[q] for r in self.runs], q,
                    one if q == "error_share" else max(r.resolution.get(q, 0.0) for r in self.runs))
            for q in sorted(quantities)
        }  # fmt: skip


def _apart(a: float, b: float) -> bool:
    return abs(a - b) > WORKLOAD_TOLERANCE * max(abs(a), abs(b))


def check_comparable(baseline: Baseline, run: Run, min_runs: int = MIN_RUNS) -> None:
    """``NotComparable`` saying why, unless ``run`` is the baseline's workload, with enough
    requests, against enough baseline runs."""
    if len(baseline.runs) < min_runs:
        raise NotComparable(
            f"the baseline holds {len(baseline.runs)} run(s): a noise band needs {min_runs} at "
            "least (record more with --record-baseline)"
        )
    fewest = min(r.requests for r in baseline.runs)
    if run.requests < max(MIN_REQUESTS, fewest / 2):
        raise NotComparable(
            f"the run holds {run.requests:g} requests, the baseline's runs {fewest:g} at "
            f"least: too few to compare (at least {max(MIN_REQUESTS, fewest / 2):g})"
        )
    models = {m for r in baseline.runs for m in r.models}
    if set(run.models) - models:
        raise NotComparable(
            f"the run's models ({', '.join(run.models)}) are not the baseline's "
            f"({', '.join(sorted(models))})"
        )
    _same_lengths(baseline, run)


def _same_lengths(baseline: Baseline, run: Run) -> None:
    output = statistics.fmean(r.output_tokens for r in baseline.runs)
    if not math.isnan(run.output_tokens) and _apart(run.output_tokens, output):
        raise NotComparable(
            f"another workload: {run.output_tokens:.1f} output tokens per request, the "
            f"baseline's {output:.1f}"
        )
    inputs = [r.input_tokens for r in baseline.runs if r.input_tokens is not None]
    if not inputs or run.input_tokens is None:
        return
    mean = statistics.fmean(inputs)
    if _apart(run.input_tokens, mean):
        raise NotComparable(
            f"another workload: {run.input_tokens:.1f} input tokens per request, the "
            f"baseline's {mean:.1f}"
        )


@dataclass(frozen=True)
class Finding:
    """One quantity of the run against its band."""

    quantity: str
    value: float
    band: Band

    @property
    def regressed(self) -> bool:
        return self.value > self.band.upper

    @property
    def change(self) -> float:
        """The change from the baseline's mean, as a share of it (NaN: a mean of 0)."""
        return (self.value - self.band.mean) / self.band.mean if self.band.mean else math.nan

    def says(self) -> str:
        unit = UNITS.get(self.quantity, " s")
        change = "up" if math.isnan(self.change) else f"{self.change:+.1%}"
        return (f"{self.quantity} {self.value:.4g}{unit} is {change} from the "
                f"baseline's {self.band.mean:.4g}{unit}, above its noise band (up to "
                f"{self.band.upper:.4g}{unit})")  # fmt: skip


def compare(baseline: Baseline, run: Run) -> list[Finding]:
    """Each quantity both have, against its band (``check_comparable`` first)."""
    return [Finding(q, run.values[q], b) for q, b in baseline.bands().items() if q in run.values]
