"""What rendering /metrics costs at the label cap, per exposition format, and how long the
event loop waits meanwhile.

Not a test: run it by hand and record what it says in docs/benchmarks.md. A sink is filled as
a busy sidecar's would be at the label cap (32 models x 3 operations, 20 traced requests of 50
tokens each per label set, so every histogram bucket that was hit has an exemplar); then each
format is rendered the way the /metrics handler renders it, five times, while a task on the
same loop sleeps 1 ms at a time and notes how late it wakes.

    python benchmarks/scrape.py
"""

from __future__ import annotations

import asyncio
import gc
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial

import uvloop
from prometheus_client import CollectorRegistry

from llmobs.export.metrics import exposition
from llmobs.export.metrics.catalogue import CATALOGUE
from llmobs.export.metrics.exposition import Format, Registry
from llmobs.observe.dialects import OPERATIONS
from llmobs.observe.record import TraceRef
from llmobs.observe.recorder import Recorder
from llmobs.observe.timing import Outcome, StreamTimer
from tests.support.recording import record_request, recording

Render = Callable[[CollectorRegistry, Executor], Awaitable[bytes]]


def fill(recorder: Recorder, models: int = 32, requests: int = 20, tokens: int = 50) -> None:
    for op in OPERATIONS:
        for m in range(models):
            for i in range(requests):
                timer = StreamTimer(0)
                t_ns = 0
                for k in range(tokens):
                    t_ns += 10_000_000 + (k * 997 % 7) * 3_000_000 + i * 100_000
                    timer.output(t_ns, 1)
                window = timer.take_window(None)  # before finish: it pools the windows
                record = timer.finish(
                    t_ns + 1000, operation=op, model=f"model-{m}", outcome=Outcome.OK,
                    status=200, stream=True, input_tokens=10, output_tokens=tokens,
                )  # fmt: skip
                trace = TraceRef(f"{m + 1:032x}", f"{i + 1:016x}")
                record_request(recorder, record, [window], trace)


async def lag_while(render: Awaitable[bytes]) -> tuple[float, float, int]:
    """(seconds the render took, the loop's worst lateness meanwhile, bytes)."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - t - 0.001)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    body = await render
    took = time.perf_counter() - start
    done = True
    await task
    return took, worst, len(body)


def _gzip(body: bytes) -> bytes:
    """As aiohttp compresses a response (zlib's default level, the gzip container)."""
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return packer.compress(body) + packer.flush()


def _gzipped(render: Render) -> Render:
    """``render``, then gzip in the rendering thread, as /metrics does for a scraper that
    takes it (``admin``: aiohttp's compressor with the scrape's executor)."""

    async def packed(registry: CollectorRegistry, pool: Executor) -> bytes:
        body = await render(registry, pool)
        return await asyncio.get_running_loop().run_in_executor(pool, _gzip, body)

    return packed


def series(registry: CollectorRegistry) -> tuple[int, int]:
    """The series a Prometheus stores of one scrape: (classic: every bucket a series; with
    native histograms: one series per label set of a histogram that has native buckets)."""
    native = {m.prometheus for m in CATALOGUE if m.native is not None}
    classic = with_native = 0
    for family in registry.collect():
        samples = len(family.samples)
        classic += samples
        if family.type == "histogram" and family.name in native:
            samples = len({tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                           for s in family.samples})  # fmt: skip
        with_native += samples
    return classic, with_native


async def main() -> None:
    registry = Registry()
    fill(recording(registry, 32)[1])
    gc.freeze()  # as llmobs serve does once started
    classic, native = series(registry)
    print(f"series at the label cap: {classic} classic, {native} with native histograms")
    formats: tuple[tuple[str, Render], ...] = (
        ("Prometheus text", partial(exposition.render, Format.TEXT)),
        ("OpenMetrics", partial(exposition.render, Format.OPENMETRICS)),
        ("Protobuf", partial(exposition.render, Format.PROTOBUF)),
    )  # fmt: skip
    formats += tuple((f"{name}, gzip", _gzipped(render)) for name, render in formats)
    with ThreadPoolExecutor(1) as pool:
        for name, render in formats:
            runs = sorted([await lag_while(render(registry, pool)) for _ in range(5)])
            lags = sorted(r[1] for r in runs)
            print(
                f"{name}: {runs[0][2] / 1024:.0f} KiB, render {runs[0][0] * 1e3:.1f}-"
                f"{runs[-1][0] * 1e3:.1f} ms, worst loop lag {lags[-1] * 1e3:.1f} ms "
                f"(median run {lags[2] * 1e3:.1f} ms)"
            )


if __name__ == "__main__":
    uvloop.run(main())
