"""What the live page costs the sidecar: its tick once a second, and a page that polls once a
second, against a Prometheus scrape of the same sidecar.

Not a test: run it by hand and record what it says in docs/benchmarks.md. A sink is filled as a
busy sidecar's would be at the label cap (``scrape.fill``: 32 models x 3 operations), the ring
holds ``--history`` seconds; then, five times each and timed on the process's CPU clock: the
tick (``LivePage.tick``), the page's poll (``/ui/data`` for the last second, rendered as the
handler does), a page opened fresh (every point), and a /metrics scrape in Prometheus text.

    python -m benchmarks.live   (from the repository root)
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import uvloop

from benchmarks.scrape import fill
from llmobs.export.metrics.exposition import Format, Registry, render
from llmobs.export.ui import LivePage, _dumps
from tests.support.recording import recording


def cpu(work: Callable[[], object], runs: int = 5) -> tuple[float, float]:
    """(best, worst) CPU seconds of ``work`` over ``runs``."""
    times = []
    for _ in range(runs):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return min(times), max(times)


async def main(history: int) -> None:
    registry = Registry()
    sink, recorder = recording(registry, 32)
    fill(recorder)
    clock = iter(range(10**9))
    page = LivePage(sink, None, history, clock=lambda: float(next(clock)))
    for _ in range(history):
        page.tick()
    gc.freeze()  # as llmobs serve does once started
    last = page.ring.times[-2]
    tick = cpu(page.tick)
    poll = cpu(lambda: _dumps(page.ring.data(last)))
    poll_size = len(_dumps(page.ring.data(last)))
    full = cpu(lambda: _dumps(page.ring.data(0.0)))
    full_size = len(_dumps(page.ring.data(0.0)))
    with ThreadPoolExecutor(1) as pool:
        times = []
        for _ in range(5):
            start = time.process_time()
            body = await render(Format.TEXT, registry, pool)
            times.append(time.process_time() - start)
    print(f"tick: {tick[0] * 1e3:.2f}-{tick[1] * 1e3:.2f} ms CPU")
    print(f"poll (the last second): {poll[0] * 1e3:.2f}-{poll[1] * 1e3:.2f} ms CPU, {poll_size} B")
    print(f"page opened ({history} s): {full[0] * 1e3:.1f}-{full[1] * 1e3:.1f} ms CPU, "
          f"{full_size / 1024:.0f} KiB")  # fmt: skip
    print(f"/metrics scrape (text): {min(times) * 1e3:.1f}-{max(times) * 1e3:.1f} ms CPU, "
          f"{len(body) / 1024:.0f} KiB")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=600, help="seconds in the ring [600]")
    uvloop.run(main(parser.parse_args().history))
