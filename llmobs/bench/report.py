"""From raw cells to what people and machines read: medians, added figures, ratios, outputs.

Added figures are taken round by round (a target's cell minus ``direct``'s cell of the same
round and concurrency), then the median over rounds is reported, as are the absolute
figures. Ratios are to ``direct`` (latency) and to ``nginx`` (latency and CPU), when those
targets ran. Outputs: a text table (stdout), JSON (NaN written as null) and a PNG of latency
against load when matplotlib is installed (``pip install 'llmobs[bench]'``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmobs.bench.figures import median, ratio
from llmobs.bench.runner import BenchResult

# Figures a target adds to direct's, per round: (output name, cell field).
ADDED = (
    ("added_ttft_p50_ms", "ttft_path_p50_ms"),
    ("added_ttft_p99_ms", "ttft_path_p99_ms"),
    ("added_delay_p50_ms", "delay_p50_ms"),
    ("added_delay_p99_ms", "delay_p99_ms"),
    ("added_jitter_ms", "gap_added_jitter_ms"),
)
ABSOLUTE = (
    "ttft_p50_ms", "ttft_p99_ms", "ttft_path_p50_ms", "ttft_path_p99_ms", "delay_p50_ms",
    "delay_p99_ms", "delay_max_ms", "gap_p50_ms", "jitter_ms", "gap_added_jitter_ms",
    "chunks_per_s", "cpu_us_per_chunk", "cpu_us_per_request", "cpu_system_share",
    "cpu_user_us_per_chunk", "rss_idle_mib", "rss_per_active_stream_kib", "tpot_ms",
)  # fmt: skip
SCRAPE = ("during_p99", "during_max", "outside_p99", "outside_max")


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def summarize(result: BenchResult) -> dict[str, Any]:
    """Medians over rounds per (target, concurrency), added figures, ratios, saturation."""
    by_key: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    direct: dict[tuple[int, int], dict[str, Any]] = {}
    for cell in result.cells:
        by_key[(cell["target"], cell["concurrency"])].append(cell)
        if cell["target"] == "direct":
            direct[(cell["round"], cell["concurrency"])] = cell
    paced: list[dict[str, Any]] = []
    for (target, level), cells in by_key.items():
        row: dict[str, Any] = {"target": target, "concurrency": level, "rounds": len(cells)}
        for name in ABSOLUTE:
            row[name] = median([_nan(c[name]) for c in cells])
        for name, source in ADDED:
            row[name] = median([
                _nan(c[source]) - _nan(direct[(c["round"], level)][source])
                for c in cells if (c["round"], level) in direct
            ])  # fmt: skip
        for name in SCRAPE:
            row[f"scrape_gap_added_{name}_ms"] = median(
                [_nan(c["scrape"][name]) for c in cells if c["scrape"]]
            )
        row["chunks_match"] = all(c["chunks_match"] for c in cells)
        row["failed"] = sum(c["failed"] for c in cells)
        paced.append(row)
    _ratios(paced, ("delay_p50_ms", "delay_p99_ms", "ttft_path_p99_ms"), "direct")
    _ratios(paced, ("delay_p50_ms", "delay_p99_ms", "ttft_path_p99_ms", "cpu_us_per_chunk",
                    "cpu_user_us_per_chunk", "cpu_us_per_request", "rss_per_active_stream_kib"),
            "nginx")  # fmt: skip
    return {"paced": paced, "saturation": _saturation(result)}


def _ratios(rows: list[dict[str, Any]], fields: Iterable[str], base: str) -> None:
    bases = {r["concurrency"]: r for r in rows if r["target"] == base}
    for row in rows:
        b = bases.get(row["concurrency"])
        for name in fields:
            row[f"{name.removesuffix('_ms')}_vs_{base}"] = (
                ratio(row[name], b[name]) if b else math.nan
            )


def _saturation(result: BenchResult) -> list[dict[str, Any]]:
    by_target: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sat in result.saturation:
        by_target[sat["target"]].append(sat)
    rows = []
    long = f"tokens_{max(result.options['saturation_tokens'])}"
    for target, sats in by_target.items():
        rows.append({
            "target": target, "rounds": len(sats), "concurrency": sats[0]["streams"],
            "chunks_per_s": median([s[long]["chunks_per_s"] for s in sats]),
            "target_cpu_util": median([_nan(s[long]["target_cpu_util"]) for s in sats]),
            "cpu_us_per_chunk": median([_nan(s[long]["cpu_us_per_chunk"]) for s in sats]),
            "cpu_system_share": median([_nan(s[long].get("cpu_system_share")) for s in sats]),
            "cpu_user_us_per_chunk": median([_nan(s[long].get("cpu_user_us_per_chunk"))
                                             for s in sats]),
            "chunks_per_cpu_s": median([_nan(s[long]["chunks_per_cpu_s"]) for s in sats]),
            "fit_cpu_us_per_chunk": median([_nan(s["fit_cpu_us_per_chunk"]) for s in sats]),
            "fit_cpu_us_per_request": median([_nan(s["fit_cpu_us_per_request"]) for s in sats]),
            "open_streams": max(s["open_streams"] for s in sats),
            "rss_per_open_stream_kib": median([_nan(s["rss_per_open_stream_kib"])
                                               for s in sats]),
            "failed": sum(s[k]["failed"] for s in sats for k in s if k.startswith("tokens_")),
        })  # fmt: skip
    _ratios(rows, ("cpu_us_per_chunk", "cpu_user_us_per_chunk", "fit_cpu_us_per_chunk"), "nginx")
    return rows


def _f(value: float, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _pct(share: float) -> str:
    return _f(share * 100, 0)


def table(result: BenchResult, summary: dict[str, Any]) -> str:
    """The human summary: one row per target and concurrency, then saturation."""
    m = result.machine
    lines = [
        f"llmobs bench: {m['cpus']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, "
        f"Python {m['python']}; {result.pinning}; {result.options['rounds']} rounds, "
        f"median over rounds; + = added to direct (same round)",
    ]
    lines += [f"skipped {t}: {why}" for t, why in result.skipped.items()]
    head = (f"{'target':12s} {'N':>4s} {'tpot':>5s} {'TTFT+p50':>8s} {'TTFT+p99':>8s} "
            f"{'dly+p50':>8s} {'dly+p99':>8s} {'dly p50':>7s} {'jit+':>6s} {'chunks/s':>8s} "
            f"{'us/chunk':>8s} {'xnginx':>6s} {'sys%':>4s} {'usr us':>6s} {'us/req':>7s} "
            f"{'KiB/str':>7s} "
            f"{'scrape+p99/max':>14s} {'match':>5s}")  # fmt: skip
    lines += ["", "paced (ms unless noted; sys%: the kernel's share of the target's CPU, usr "
              "us: its user time per chunk; scrape+: gap added to chunks in flight during a "
              "/metrics scrape)", head, "-" * len(head)]  # fmt: skip
    order = {t: i for i, t in enumerate(result.options["targets"])}
    for r in sorted(summary["paced"], key=lambda r: (r["concurrency"], order[r["target"]])):
        scrape = (f"{_f(r['scrape_gap_added_during_p99_ms'])}/"
                  f"{_f(r['scrape_gap_added_during_max_ms'])}")  # fmt: skip
        lines.append(
            f"{r['target']:12s} {r['concurrency']:4d} {r['tpot_ms']:5.0f} "
            f"{_f(r['added_ttft_p50_ms'], 3):>8s} {_f(r['added_ttft_p99_ms'], 3):>8s} "
            f"{_f(r['added_delay_p50_ms'], 3):>8s} {_f(r['added_delay_p99_ms'], 3):>8s} "
            f"{_f(r['delay_p50_ms'], 3):>7s} {_f(r['added_jitter_ms'], 3):>6s} "
            f"{_f(r['chunks_per_s'], 0):>8s} {_f(r['cpu_us_per_chunk'], 1):>8s} "
            f"{_f(r['cpu_us_per_chunk_vs_nginx']):>6s} {_pct(r['cpu_system_share']):>4s} "
            f"{_f(r['cpu_user_us_per_chunk'], 1):>6s} {_f(r['cpu_us_per_request'], 0):>7s} "
            f"{_f(r['rss_per_active_stream_kib'], 1):>7s} {scrape:>14s} "
            f"{'yes' if r['chunks_match'] else 'NO':>5s}"
        )
    if summary["saturation"]:
        tokens = result.options["saturation_tokens"]
        head = (f"{'target':12s} {'chunks/s':>9s} {'cpu util':>8s} {'us/chunk':>8s} "
                f"{'chunks/cpu-s':>12s} {'fit us/chunk':>12s} {'fit us/req':>10s} "
                f"{'xnginx':>6s} {'sys%':>4s} {'usr us':>6s} {'open':>5s} "
                f"{'KiB/open':>8s}")  # fmt: skip
        lines += ["", f"saturation ({result.options['saturation_streams']} streams, unpaced "
                  f"engine, {max(tokens)} tokens; fit from {tokens[0]} and {tokens[1]} tokens)",
                  head, "-" * len(head)]  # fmt: skip
        for r in sorted(summary["saturation"], key=lambda r: order[r["target"]]):
            lines.append(
                f"{r['target']:12s} {_f(r['chunks_per_s'], 0):>9s} "
                f"{_f(r['target_cpu_util']):>8s} {_f(r['cpu_us_per_chunk'], 1):>8s} "
                f"{_f(r['chunks_per_cpu_s'], 0):>12s} {_f(r['fit_cpu_us_per_chunk'], 1):>12s} "
                f"{_f(r['fit_cpu_us_per_request'], 0):>10s} "
                f"{_f(r['cpu_us_per_chunk_vs_nginx']):>6s} {_pct(r['cpu_system_share']):>4s} "
                f"{_f(r['cpu_user_us_per_chunk'], 1):>6s} {r['open_streams']:5d} "
                f"{_f(r['rss_per_open_stream_kib'], 1):>8s}"
            )
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def to_json(result: BenchResult, summary: dict[str, Any]) -> str:
    """Everything: machine, options, raw cells, saturation, and the summary."""
    return json.dumps(_clean({**asdict(result), "summary": summary}), indent=1)


def plot(summary: dict[str, Any], path: Path) -> str | None:
    """Latency against load as a PNG; returns why not, if matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415 (optional dependency, only for this)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib import ticker  # noqa: PLC0415
        from matplotlib.lines import Line2D  # noqa: PLC0415
    except ImportError:
        return "matplotlib not installed (pip install 'llmobs[bench]'): no PNG written"
    panels = (
        ("added_delay_p50_ms", "added per-chunk delay p50 (ms)"),
        ("added_delay_p99_ms", "added per-chunk delay p99 (ms)"),
        ("added_ttft_p99_ms", "added TTFT p99 (ms)"),
        ("cpu_us_per_chunk", "target CPU per chunk (µs)"),
    )
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    by_target: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in summary["paced"]:
        by_target[row["target"]].append(row)
    colours = {t: f"C{i}" for i, t in enumerate(by_target)}  # one colour per target throughout
    levels = sorted({r["concurrency"] for r in summary["paced"]})
    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")  # as the table prints them
    for ax, (name, title) in zip(axes.flat, panels, strict=True):
        values = []
        for target, unsorted in by_target.items():
            rows = sorted(unsorted, key=lambda r: r["concurrency"])
            ys = [r[name] for r in rows]
            if all(math.isnan(y) for y in ys):
                continue
            values += [abs(y) for y in ys if not math.isnan(y)]
            ax.plot([r["concurrency"] for r in rows], ys, marker="o", label=target,
                    color=colours[target])  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        if name == "cpu_us_per_chunk":  # all positive, tens to hundreds of us
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        elif max(values, default=0.0) > 10.0:  # sub-ms and seconds on one axis
            ax.set_yscale("symlog", linthresh=1.0)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=c, marker="o", label=t) for t, c in colours.items()]
    axes.flat[0].legend(handles=handles)
    fig.suptitle("llmobs bench: latency and cost against load (median over rounds)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
