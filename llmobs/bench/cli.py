"""Command line of the bench: ``llmobs bench``, ``python -m llmobs.bench``, benchmarks/bench.py.

Parses the options into ``BenchOptions``, runs the plan, prints the table and writes JSON and
the PNG if asked. Ctrl-C or SIGTERM stops the run and every process it started (the runner
stops them in ``finally``; SIGTERM is turned into the same interruption as Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TypeVar

from llmobs.bench.report import plot, summarize, table, to_json
from llmobs.bench.runner import BenchOptions, run_bench
from llmobs.bench.targets import TARGETS

T = TypeVar("T")


def _list(parse: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    def convert(text: str) -> tuple[T, ...]:
        return tuple(parse(part.strip()) for part in text.split(",") if part.strip())

    return convert


def _target(name: str) -> str:
    if name not in TARGETS:
        raise argparse.ArgumentTypeError(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
    return name


def _shown(value: object) -> str:
    """A default as a user would type it back: ``8``, not ``8.0``; ``1,16``; ``on``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(_shown(item) for item in value)
    return str(value)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's flags (defaults: ``BenchOptions``, shown as ``[default]``)."""
    d = BenchOptions()
    add = parser.add_argument
    add(
        "--targets",
        type=_list(_target),
        default=d.targets,
        help=f"comma-separated, run in this order each round [{_shown(d.targets)}]",
    )
    add(
        "--concurrency",
        type=_list(int),
        default=d.concurrency,
        help=f"concurrent streams per cell [{_shown(d.concurrency)}]",
    )
    add("--rounds", type=int, default=d.rounds, help=f"interleaved rounds [{d.rounds}]")
    add("--tokens", type=int, default=d.tokens, help=f"output tokens per request [{d.tokens}]")
    add(
        "--prompt-tokens",
        type=int,
        default=d.prompt_tokens,
        help=f"prompt tokens per request [{d.prompt_tokens}]",
    )
    add(
        "--tpot",
        type=float,
        default=d.tpot,
        help=f"seconds between a stream's tokens in paced cells [{_shown(d.tpot)}]",
    )
    add(
        "--max-paced-rate",
        type=float,
        default=d.max_paced_rate,
        help="chunks/s a paced cell offers at most: TPOT is stretched to N / this when N "
        f"streams at --tpot would exceed it [{_shown(d.max_paced_rate)}]",
    )
    add(
        "--duration",
        type=float,
        default=d.duration,
        help=f"seconds of load per paced cell, before the drain [{_shown(d.duration)}]",
    )
    add(
        "--arrival-rate",
        type=float,
        default=None,
        help="open loop: Poisson arrivals at this many requests/s, at most N in flight "
        "[closed loop]",
    )
    add(
        "--scrape-interval",
        type=float,
        default=d.scrape_interval,
        help=f"seconds between GETs of an llmobs target's /metrics in paced cells; 0: none "
        f"[{_shown(d.scrape_interval)}]",
    )
    add(
        "--scrape-format",
        choices=("text", "openmetrics", "protobuf"),
        default=d.scrape_format,
        help=f"the exposition format those GETs ask for [{d.scrape_format}]",
    )
    add(
        "--saturation",
        action=argparse.BooleanOptionalAction,
        default=d.saturation,
        help="also run the unpaced saturation cells and the open-streams memory check; "
        f"--no-saturation: only the paced cells [{_shown(d.saturation)}]",
    )
    add(
        "--saturation-streams",
        type=int,
        default=d.saturation_streams,
        help=f"streams in the saturation cells [{d.saturation_streams}]",
    )
    add(
        "--saturation-tokens",
        type=_list(int),
        default=d.saturation_tokens,
        help="two output lengths for the saturation cells (the CPU fit per chunk and per "
        f"request needs both) [{_shown(d.saturation_tokens)}]",
    )
    add(
        "--saturation-duration",
        type=float,
        default=d.saturation_duration,
        help=f"seconds per saturation run [{_shown(d.saturation_duration)}]",
    )
    add(
        "--open-streams",
        type=int,
        default=d.open_streams,
        help=f"idle streams held open to measure memory per stream, 0: skip [{d.open_streams}]",
    )
    add(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=d.pin,
        help=f"pin engine, client and target to their own cores [{_shown(d.pin)}]",
    )
    add("--nginx", default=None, help="nginx binary [nginx on PATH]")
    add("--litellm", default=None, help="LiteLLM proxy command [litellm on PATH]")
    add("--llmobs-root", type=Path, default=None,
        help="run the llmobs targets from this source tree (another version, to compare) "
             "[this checkout]")  # fmt: skip
    add("--json", type=Path, default=None, help="write every figure here as JSON")
    add("--png", type=Path, default=None, help="plot latency against load here")
    add("--workdir", type=Path, default=None,
        help="keep configs and the processes' logs here [a temp dir, removed]")  # fmt: skip


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """``BenchOptions`` from parsed arguments (checked here, so mistakes fail before a run)."""
    if len(args.saturation_tokens) != 2 or len(set(args.saturation_tokens)) != 2:
        raise SystemExit("llmobs bench: --saturation-tokens takes two different lengths")
    if not args.concurrency or min(args.concurrency) < 1 or args.rounds < 1:
        raise SystemExit("llmobs bench: --concurrency and --rounds must be >= 1")
    return BenchOptions(
        targets=args.targets, concurrency=args.concurrency, rounds=args.rounds,
        tokens=args.tokens, prompt_tokens=args.prompt_tokens, tpot=args.tpot,
        max_paced_rate=args.max_paced_rate, duration=args.duration,
        arrival_rate=args.arrival_rate, scrape_interval=args.scrape_interval,
        scrape_format=args.scrape_format, saturation=args.saturation,
        saturation_streams=args.saturation_streams,
        saturation_tokens=args.saturation_tokens, saturation_duration=args.saturation_duration,
        open_streams=args.open_streams, pin=args.pin, nginx=args.nginx, litellm=args.litellm,
        llmobs_root=args.llmobs_root,
    )  # fmt: skip


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_bench_cli(args: argparse.Namespace) -> int:
    """Run the bench from parsed arguments; print the table, write JSON and PNG."""
    options = options_from_args(args)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = asyncio.run(
            run_bench(options, args.workdir, lambda line: print(line, file=sys.stderr))
        )
    except KeyboardInterrupt:
        print("llmobs bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = summarize(result)
    print(table(result, summary))
    if args.json:
        args.json.write_text(to_json(result, summary))
        print(f"JSON: {args.json}")
    if args.png:
        why = plot(summary, args.png)
        print(f"PNG: {args.png}" if why is None else f"PNG: skipped, {why}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m llmobs.bench`` and benchmarks/bench.py."""
    parser = argparse.ArgumentParser(
        prog="llmobs bench", description=__doc__.split("\n", 1)[0] if __doc__ else None
    )
    add_bench_arguments(parser)
    return run_bench_cli(parser.parse_args(argv))
