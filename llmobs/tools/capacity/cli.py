"""``llmobs capacity``: its flags, and a search from the first level to the knee.

Each level is driven through the sidecar (``drive``), judged (``figures``), fed to the
search (``search``); the lowest level that broke the objectives is explained from what the
sidecar saw (``causes``). Progress goes to stderr, a line per level; the curve to stdout (a
table, or ``--json``) and to ``--out``'s files. Exit 0 with a knee, 1 when not even the first
level held, 2 when it cannot run (``EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from llmobs.config.options import ConfigError, parse_duration
from llmobs.tools.capacity import drive, report
from llmobs.tools.capacity.causes import explain
from llmobs.tools.capacity.figures import Objectives, level
from llmobs.tools.capacity.report import Curve, Point
from llmobs.tools.capacity.search import Search
from llmobs.tools.capacity.workload import Workload, WorkloadError, workload_of
from llmobs.tools.slo.sources import TOKEN_ENV, check_url

EXIT_CODES = (
    "Exit codes: 0 the knee found (or every load up to --max held; with --at: that load "
    "held); 1 no load tried held the objectives, not even below --start (--at: that load did "
    "not); 2 it could not run: nothing at --url, no model, a workload that cannot be read, "
    "a flag out of range."
)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, 1 or more: {text!r}")
    return value


def _duration(text: str) -> float:
    """A bound: a duration as the sidecar's --slo-* flags take one (500ms, 2s, 1.5)."""
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and below 1: {text!r}")
    return value


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", required=True, metavar="URL", help="the sidecar's proxy (the load goes here)")
    add(
        "--metrics-url",
        default="",
        metavar="URL",
        help="the sidecar's /metrics: what it saw says what bends the curve [none: not said]",
    )
    add(
        "--metrics-token",
        default=None,
        metavar="TOKEN",
        help=f"bearer token for --metrics-url [env {TOKEN_ENV}]",
    )
    add("--model", default="", metavar="NAME", help="model to ask for [the first /v1/models lists]")
    add(
        "--workload",
        default="chat",
        metavar="SPEC",
        help="fixed:PROMPT,OUTPUT (tokens), chat, rag, or a JSONL file of lengths or prompts "
        "(docs/measure-first.md) [chat]",
    )
    add("--seed", type=int, default=0, metavar="N", help="seed of the workload and arrivals [0]")
    add(
        "--by",
        choices=("concurrency", "rate"),
        default="concurrency",
        help="load as concurrent clients (closed loop) or requests per second (Poisson "
        "arrivals) [concurrency]",
    )
    add("--start", type=_positive, default=1.0, metavar="LOAD", help="the first load tried [1]")
    add("--max", type=_positive, default=256.0, metavar="LOAD", help="the highest load tried [256]")
    add(
        "--at",
        type=_positive,
        default=None,
        metavar="LOAD",
        help="run this one load, no search; every request let end (concurrency): a run to "
        "record or gate with llmobs slo --baseline (docs/measure-first.md)",
    )
    add(
        "--precision",
        type=_fraction,
        default=0.1,
        metavar="FRACTION",
        help="stop when the knee is known within this share of it (concurrency: within one "
        "client at least) [0.1]",
    )
    add("--ttft", type=_duration, default=None, metavar="DURATION", help="bound on TTFT (2s)")
    add(
        "--tpot",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="bound on time per output token after the first (50ms)",
    )
    add(
        "--max-gap",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="bound on a request's longest wait between two chunks",
    )
    add(
        "--quantile",
        type=_fraction,
        default=0.9,
        metavar="Q",
        help="the share of requests each bound holds for [0.9]",
    )
    add(
        "--requests",
        type=_count,
        default=32,
        metavar="N",
        help="requests measured per level, at least [32]",
    )
    add(
        "--rounds",
        type=_count,
        default=4,
        metavar="N",
        help="... and at least N per client (rate: N seconds of arrivals) [4]",
    )
    add(
        "--scrape-interval",
        type=_duration,
        default=1.0,
        metavar="DURATION",
        help="seconds between readings of --metrics-url during a level [1]",
    )
    add(
        "--out",
        default="",
        metavar="PREFIX",
        help="write PREFIX.json, PREFIX.csv and PREFIX.png (with matplotlib) [none]",
    )
    add("--json", action="store_true", help="print the curve as JSON instead of a table")


def check_loads(args: argparse.Namespace) -> None:
    """Concurrency is whole clients, one at least; ``--out`` a folder that exists."""
    if args.by == "concurrency" or args.at is not None:
        for flag, value in (("--start", args.start), ("--max", args.max), ("--at", args.at)):
            if value is not None and (value < 1 or value != int(value)):
                raise ConfigError(f"{flag}: concurrency is whole clients, 1 or more: {value:g}")
    if args.max < args.start:
        raise ConfigError(f"--max ({args.max:g}) is below --start ({args.start:g})")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise ConfigError(f"--out: no folder {Path(args.out).parent} to write {args.out}.* in")


def objectives_of(args: argparse.Namespace) -> Objectives:
    bounds = {name: value for name, value in
              (("ttft", args.ttft), ("tpot", args.tpot), ("max_gap", args.max_gap))
              if value is not None}  # fmt: skip
    if not bounds:
        raise ConfigError("give at least one objective: --ttft, --tpot or --max-gap (500ms, 2s)")
    return Objectives(bounds, args.quantile)


def _measured(args: argparse.Namespace, load: float) -> int:
    return max(int(args.requests), math.ceil(int(args.rounds) * load))


def _progress(err: TextIO, curve: Curve, point: Point, started: float) -> None:
    lv = point.level
    q = curve.objectives.quantile
    shown = ", ".join(
        f"{name} p{q * 100:g} {report.quantile_shown(lv, name, q)}" for name in
        curve.objectives.bounds
    )  # fmt: skip
    verdict = "holds" if lv.holds else "misses " + ",".join(lv.misses)
    print(f"[{time.monotonic() - started:6.0f} s] load {lv.load:g}: {lv.requests} requests, "
          f"{lv.throughput:.2f}/s; {shown}: {verdict}", file=err, flush=True)  # fmt: skip


async def run_level(
    args: argparse.Namespace, target: drive.Target, workload: Workload, objectives: Objectives,
    load: float,
) -> Point:  # fmt: skip
    """One level driven and judged; explained when it broke the objectives."""
    measured = _measured(args, load)
    async with drive.session_for(load, args.by == "concurrency") as session:
        if args.by == "concurrency":
            run = drive.closed_loop(
                session, target, workload, int(load), measured, drain=args.at is not None
            )
        else:
            run = drive.open_loop(session, target, workload, load, measured, args.seed)
        samples, ev = await drive.watched(target, run, args.scrape_interval)
    clients = int(load) if args.by == "concurrency" else None
    figures = level(load, samples, objectives, clients)
    return Point(figures, ev, None if figures.holds else explain(figures, ev))


async def search_curve(
    args: argparse.Namespace, target: drive.Target, workload: Workload, curve: Curve,
    err: TextIO,
) -> None:  # fmt: skip
    """Run levels until the search knows the knee (``--at``: the one level); the curve gets
    every level."""
    search = Search(args.start, args.precision, args.max, args.by == "concurrency")
    started = time.monotonic()
    load = search.next() if args.at is None else args.at
    while load is not None:
        point = await run_level(args, target, workload, curve.objectives, load)
        curve.points.append(point)
        search.record(load, point.level.holds)
        _progress(err, curve, point, started)
        load = search.next() if args.at is None else None
    curve.knee, curve.failed = search.knee, search.failed
    broke = [p for p in curve.points if p.level.load == curve.failed]
    curve.cause = broke[0].cause if broke else None
    curve.seconds = time.monotonic() - started


async def _model(args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    async with drive.session_for(1, True) as session:
        try:
            model = await drive.served_model(session, args.url)
        except drive.Unreachable as exc:
            raise ConfigError(f"--url: {exc}: start the sidecar, or check the URL") from None
    if model is None:
        raise ConfigError(f"--model: {args.url}/v1/models lists no model: name one")
    return model


def _write(curve: Curve, prefix: str, err: TextIO) -> None:
    base = Path(prefix)
    base.with_name(base.name + ".json").write_text(report.to_json(curve) + "\n")
    base.with_name(base.name + ".csv").write_text(report.to_csv(curve))
    why_not = report.plot(curve, base.with_name(base.name + ".png"))
    if why_not:
        print(f"llmobs capacity: {why_not}", file=err)


def run_capacity_cli(
    args: argparse.Namespace, out: TextIO, environ: Mapping[str, str] | None = None,
    err: TextIO = sys.stderr,
) -> int:  # fmt: skip
    """Search, print, write; the exit code (``EXIT_CODES``)."""
    env = os.environ if environ is None else environ
    check_url("--url", args.url)
    if args.metrics_url:
        check_url("--metrics-url", args.metrics_url)
    check_loads(args)
    objectives = objectives_of(args)
    try:
        workload = workload_of(args.workload, args.seed)
    except WorkloadError as exc:
        raise ConfigError(f"--workload: {exc}") from None
    model = asyncio.run(_model(args))
    token = args.metrics_token if args.metrics_token is not None else env.get(TOKEN_ENV, "")
    target = drive.Target(args.url.rstrip("/"), model, args.metrics_url, token)
    curve = Curve(args.by, workload.name, workload.mean_prompt_tokens,
                  workload.mean_output_tokens, objectives, args.url, model,
                  single=args.at is not None)  # fmt: skip
    print(f"llmobs capacity: {model} at {args.url}, workload {workload.name}, by {args.by}",
          file=err)  # fmt: skip
    asyncio.run(search_curve(args, target, workload, curve, err))
    if args.out:
        _write(curve, args.out, err)
    print(report.to_json(curve) if args.json else report.table(curve) + "\n\n" +
          report.headline(curve), file=out)  # fmt: skip
    return 0 if curve.knee is not None else 1
