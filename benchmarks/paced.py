"""The bench's paced cell, alone, for pricing a change where it is judged.

In process (``inproc.py``) the relay's code stays warm between reads. In the bench's paced
cells it does not: the relay sleeps in ``epoll_wait`` between bursts of reads, and the
kernel's TCP code runs on its core in between, so a part that costs 200 ns in a warm loop can
cost a microsecond there. This runs that cell (the bench's engine, client, pinning, warm-up)
for each of several targets, each from its own tree, in turn for several rounds, and prints
the target's CPU per chunk (user and system, from ``/proc``) and the median of each. A tree
with one part of observation taken out prices that part (docs/benchmarks.md).

    python benchmarks/paced.py --cell llmobs:/tmp/a --cell llmobs:/tmp/b --cell nginx: \\
        --streams 128 --tokens 64 --duration 6 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path

from llmobs.bench import procfs
from llmobs.bench.runner import (
    BenchOptions,
    sim_flags,
    start_sim,
    tpot_for,
    wait_ready,
    warm_up,
)
from llmobs.bench.stamped_load import LoadSpec, run_load, session_for
from llmobs.bench.targets import Launcher, affinity, plan_pinning


async def cell(target: str, root: Path | None, streams: int, tokens: int, duration: float) -> float:
    """CPU microseconds per chunk of ``target`` (from ``root``) in one paced run."""
    options = BenchOptions(
        targets=(target,), concurrency=(streams,), tokens=tokens, llmobs_root=root
    )
    pinning = plan_pinning(sorted(os.sched_getaffinity(0)))
    launcher = Launcher(Path(tempfile.mkdtemp()), pinning, llmobs_root=root)
    try:
        with affinity(pinning.client):
            tpot = tpot_for(options, streams)
            flags = sim_flags(options, tpot, max(streams, 64), tokens)
            sim = await start_sim(launcher, flags, options.model)
            started = launcher.target(target, sim.url, options.model)
            async with session_for(streams) as session, session_for(4) as admin:
                await wait_ready(admin, started, options.model)
                await warm_up(session, started.url, streams, options.model)
                pids = procfs.tree(started.pid)
                before = procfs.cpu_seconds(pids)
                spec = LoadSpec(
                    started.url, streams, duration, tokens, 32, options.model, record=False
                )
                result = await run_load(spec, session)
                used = procfs.cpu_seconds(pids) - before
        return used / max(result.chunks, 1) * 1e6
    finally:
        launcher.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cell", action="append", required=True,
        help="TARGET:ROOT (llmobs, llmobs-bare, nginx, direct; ROOT may be empty: this tree)",
    )  # fmt: skip
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cells = [tuple(c.split(":", 1)) if ":" in c else (c, "") for c in args.cell]
    figures: dict[str, list[float]] = {c: [] for c in args.cell}
    for n in range(args.rounds):
        for name, (target, root) in zip(args.cell, cells, strict=True):
            tree = Path(root).resolve() if root else None
            us = asyncio.run(cell(target, tree, args.streams, args.tokens, args.duration))
            figures[name].append(us)
            print(f"round {n + 1}  {name}  {us:.1f} us per chunk", flush=True)
    for name, values in figures.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}  median {statistics.median(values):.1f} us per chunk ({rounds})")


if __name__ == "__main__":
    main()
