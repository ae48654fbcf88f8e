"""Builds dashboards/llmobs.json, the main Grafana dashboard, from the rows in dashboards/panels/.

Dashboards as code: edit a row's module in dashboards/panels/, run
``python dashboards/generate.py``, commit both. ``--check`` exits 1 when the committed JSON is
not what this script builds (CI runs it through tests/deploy/test_dashboards.py). Every query
uses only metrics of the catalogue (``llmobs/export/metrics/catalogue.py``), by the names it
gives them, and every metric of the catalogue is on a panel (the test checks both); template
variables: datasource, namespace, job, pod, model (the first three pick pods, "All" by
default: one pod, one job's, or the fleet, summed as Prometheus sums them), slo_window.

Panels, queries, variables and the dashboard itself are built with Grafana's
grafana-foundation-sdk (typed builders generated from Grafana 11.2's schema, a test
dependency): a misspelt option or a wrong enum value fails here, not in Grafana. Two things
of an export stay outside it: the ``__requires`` header and a query variable's
``definition``.

The engine's queue and KV cache come from the sidecar's engine collector, under uniform names
with an ``engine`` label, whatever the engine; the GPU row from its NVML collector, with MBU
next to the bandwidth NVML measures (docs/gpu.md says how the two differ).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from panels.board import render

OUT = Path(__file__).resolve().with_name("llmobs.json")


def main(argv: Sequence[str] | None = None) -> int:
    """Write the dashboard, or with ``--check`` only say whether the committed one is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if llmobs.json is stale")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON goes")
    args = parser.parse_args(argv)
    text_ = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text_:
            print(f"{args.out} is stale: run python dashboards/generate.py", file=sys.stderr)
            return 1
        return 0
    root = OUT.parent.parent
    shown = args.out.relative_to(root) if args.out.is_relative_to(root) else args.out
    if args.out.exists() and args.out.read_text() == text_:
        print(f"{shown}: unchanged")
    else:
        args.out.write_text(text_)
        print(f"{shown}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
