"""What labelling by tenant costs at the caps: series and exposition bytes of a sink filled
with every (operation, model, tenant) label set, for the default ``--tenant-metrics`` and with
the per-token ITL too, against the same sink without tenants (docs/benchmarks.md, Tenants).

    python -m benchmarks.tenants [--models 32] [--tenants 34]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from prometheus_client import CollectorRegistry, generate_latest

from llmobs.config.tenants import DEFAULT_METRICS, Tenancy
from llmobs.observe.dialects import OPERATIONS
from llmobs.observe.record import RequestRecord
from llmobs.observe.timing import Outcome, StreamTimer
from tests.support.recording import recording


def filled(models: int, tenants: int, metrics: tuple[str, ...] | None) -> tuple[int, int, float]:
    """(series, exposition bytes, MiB the sink took) with one request per label set."""
    tracemalloc.start()
    registry = CollectorRegistry()
    tenancy = Tenancy(header="x-tenant", metrics=metrics) if metrics is not None else None
    sink, recorder = recording(registry, models, tenancy=tenancy, max_tenants=tenants)
    admission = recorder.admission
    for op in OPERATIONS:
        for m in range(models):
            for t in range(tenants if metrics is not None else 1):
                timer = StreamTimer(0)
                for k in range(1, 50):
                    timer.output(k * 20_000_000, 1)
                window = timer.take_window(None)
                stats = timer.finish(
                    10**9, operation=op, model=f"model-{m}", outcome=Outcome.OK, status=200,
                    stream=True, input_tokens=10, output_tokens=49,
                )  # fmt: skip
                label, tenant = admission.labels(stats.model, f"tenant-{t}", True)
                sink.consume(RequestRecord(stats, (window,), None, None, label, tenant=tenant))
    took = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    text = generate_latest(registry)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return series, len(text), took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=32)
    parser.add_argument("--tenants", type=int, default=34)
    args = parser.parse_args()
    for name, metrics in (("no tenants", None), ("default", DEFAULT_METRICS),
                          ("default + itl", (*DEFAULT_METRICS, "itl"))):  # fmt: skip
        start = time.perf_counter()
        series, size, mib = filled(args.models, args.tenants, metrics)
        print(f"{name}: {series:,} samples, {size / 2**20:.1f} MiB of text, "
              f"{mib:.0f} MiB held, {time.perf_counter() - start:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
