"""The curve written out: a table for people, JSON and CSV for tools, a PNG when matplotlib
is installed (``pip install 'llmobs[bench]'``). Throughput against latency, level by level,
with the knee marked and what bent the curve there."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmobs.tools.capacity.causes import Cause, Evidence
from llmobs.tools.capacity.figures import QUANTITIES, Level, Objectives


@dataclass
class Point:
    """One level of the curve: its figures, what the sidecar saw, and, when it broke its
    objectives, why."""

    level: Level
    evidence: Evidence
    cause: Cause | None = None


@dataclass
class Curve:
    """A whole search: the workload, the objectives, the levels in load order, the knee."""

    mode: str  # concurrency | rate
    workload: str
    mean_prompt_tokens: float
    mean_output_tokens: float
    objectives: Objectives
    url: str = ""
    model: str = ""
    points: list[Point] = field(default_factory=list)
    knee: float | None = None
    failed: float | None = None  # the lowest load that broke the objectives
    cause: Cause | None = None  # why it broke there
    seconds: float = 0.0
    single: bool = False  # one level (--at), no search

    def sorted_points(self) -> list[Point]:
        return sorted(self.points, key=lambda p: p.level.load)


def _q(level: Level, quantity: str, q: float) -> float:
    return level.quantiles.get(quantity, {}).get(q, math.nan)


def quantile_shown(level: Level, quantity: str, q: float) -> str:
    """The level's ``q`` of ``quantity`` exactly as judged, for the progress line."""
    value = level.judged.get(quantity)
    return "n/a" if value is None else f"{value:.3g} s"


def _load(curve: Curve, load: float | None) -> str:
    if load is None:
        return "none"
    unit = "clients" if curve.mode == "concurrency" else "requests/s"
    return f"{load:g} {unit}"


def headline(curve: Curve) -> str:
    """The answer in a sentence: the knee, how well it is known, what bends the curve."""
    q = f"p{curve.objectives.quantile * 100:g}"
    bounds = ", ".join(f"{name} {q} <= {bound:g} s" for name, bound in
                       curve.objectives.bounds.items())  # fmt: skip
    if curve.single and curve.points:
        lv = curve.points[0].level
        verdict = "held" if lv.holds else "missed " + ", ".join(lv.misses)
        text = f"at {_load(curve, lv.load)}: {verdict} ({bounds})"
    elif curve.knee is None:
        text = f"no load tried held the objectives ({bounds})"
    else:
        text = f"knee: {_load(curve, curve.knee)} within {bounds}"
        if curve.failed is not None:
            text += f" ({_load(curve, curve.failed)} did not)"
        else:
            text += " (the highest load tried: the knee is at least this)"
    if curve.cause is not None:
        text += f"\nwhat bends it: {curve.cause.says}"
    return text


def table(curve: Curve) -> str:
    """The levels in load order: throughput, goodput, TTFT and TPOT quantiles, the verdict."""
    head = f"{'load':>8} {'req/s':>7} {'good/s':>7} {'tok/s':>8} {'TTFT p50':>9} " \
        f"{'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9}  verdict"  # fmt: skip
    lines = [head]
    for point in curve.sorted_points():
        lv = point.level
        verdict = "holds" if lv.holds else "misses " + ",".join(lv.misses)
        if point.cause is not None:
            verdict += f" ({point.cause.name})"
        lines.append(
            f"{lv.load:>8g} {lv.throughput:>7.2f} {lv.goodput:>7.2f} {lv.output_tps:>8.1f} "
            f"{_q(lv, 'ttft', 0.5):>9.3f} {_q(lv, 'ttft', 0.9):>9.3f} "
            f"{_q(lv, 'tpot', 0.5):>9.4f} {_q(lv, 'tpot', 0.9):>9.4f}  {verdict}"
        )
    return "\n".join(lines)


def _row(point: Point) -> dict[str, Any]:
    lv, ev = point.level, point.evidence
    row: dict[str, Any] = {
        "load": lv.load, "requests": lv.requests, "errors": lv.errors,
        "seconds": round(lv.seconds, 3), "throughput_rps": lv.throughput,
        "output_tokens_per_s": lv.output_tps, "goodput_rps": lv.goodput,
        "good_output_tokens_per_s": lv.good_tps, "holds": lv.holds,
        "misses": ",".join(lv.misses), "cause": point.cause.name if point.cause else "",
    }  # fmt: skip
    for quantity in QUANTITIES:
        for q in (0.5, 0.9, 0.95, 0.99):
            row[f"{quantity}_p{q * 100:g}_s"] = _q(lv, quantity, q)
    row["queue_s"] = ev.phases.get("queue", 0.0)
    row["prefill_s"] = ev.phases.get("prefill", 0.0)
    row["prefill_stalls"] = ev.stalls.get("prefill", 0.0)
    row["preemptions"] = ev.preemptions
    for name in ("waiting", "running", "kv_usage", "mbu"):
        value = getattr(ev, name)
        row[name] = value if value is not None else math.nan
    return row


def to_json(curve: Curve) -> str:
    """The whole search as JSON (NaN: not measured, written as null)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    document = {
        "kind": "llmobs-capacity",
        "mode": curve.mode,
        "url": curve.url,
        "model": curve.model,
        "workload": {
            "name": curve.workload,
            "mean_prompt_tokens": curve.mean_prompt_tokens,
            "mean_output_tokens": curve.mean_output_tokens,
        },
        "objectives": {
            "quantile": curve.objectives.quantile,
            "bounds_s": dict(curve.objectives.bounds),
        },
        "knee": None if curve.single else curve.knee,
        "failed": None if curve.single else curve.failed,
        "cause": None
        if curve.cause is None
        else {"name": curve.cause.name, "says": curve.cause.says},
        "seconds": round(curve.seconds, 1),
        "levels": [{k: clean(v) for k, v in _row(p).items()} for p in curve.sorted_points()],
    }
    return json.dumps(document, indent=2)


def to_csv(curve: Curve) -> str:
    """One row per level, the JSON's columns."""
    rows = [_row(p) for p in curve.sorted_points()]
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def plot(curve: Curve, path: Path) -> str | None:
    """Throughput against TTFT and TPOT (the objective's quantile) as a PNG, the knee
    marked; returns why not, if matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415 (optional dependency, only for this)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib not installed (pip install 'llmobs[bench]'): no PNG written"
    q = curve.objectives.quantile
    points = curve.sorted_points()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    for ax, quantity in zip(axes, ("ttft", "tpot"), strict=True):
        xs = [p.level.output_tps for p in points]
        ys = [p.level.quantiles.get(quantity, {}).get(_nearest(q), math.nan) for p in points]
        ax.plot(xs, ys, marker="o", color="C0")
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(f"{p.level.load:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=8, color="C0" if p.level.holds else "C3")  # fmt: skip
        bound = curve.objectives.bounds.get(quantity)
        if bound is not None:
            ax.axhline(bound, color="C3", linestyle="--", linewidth=1, label=f"bound {bound:g} s")
        knee = [p for p in points if p.level.load == curve.knee]
        if knee:
            lv = knee[0].level
            ax.axvline(lv.output_tps, color="C2", linestyle=":", label=f"knee {lv.load:g}")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{quantity.upper()} p{_nearest(q) * 100:g} (s)")
        ax.legend(loc="upper left", fontsize=8)
    title = headline(curve).splitlines()
    fig.suptitle(title[0] + (f"\n{curve.cause.says}" if curve.cause else ""), fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _nearest(q: float) -> float:
    """The reported quantile nearest the objective's (the curve keeps 0.5, 0.9, 0.95, 0.99)."""
    return min((0.5, 0.9, 0.95, 0.99), key=lambda x: abs(x - q))
