"""``llmobs slo --baseline`` and ``--record-baseline``: a run against a stored baseline, or
one more run stored in it.

The run is what the source counted (a sidecar since it started; Prometheus over --range).
Exit 0 within the noise band, 1 when a quantity regressed beyond it (each named, with by
how much), 2 when the run and the baseline cannot be compared (``BASELINE_EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, TextIO

from llmobs.config.options import ConfigError
from llmobs.tools.slo import baseline
from llmobs.tools.slo.baseline import Baseline, Finding, NotComparable, Run
from llmobs.tools.slo.sources import Source

BASELINE_EXIT_CODES = (
    "With --baseline: 0 every quantity within the baseline's noise band; 1 a regression "
    "beyond it (named, with by how much); 2 not comparable: another workload, too few "
    "requests, a baseline of fewer than three runs, or a source that cannot be read."
)


def add_baseline_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--baseline", metavar="FILE", default=None,
        help="compare this run with the baseline's runs instead of judging objectives "
        "(docs/measure-first.md)",
    )  # fmt: skip
    group.add_argument(
        "--record-baseline", metavar="FILE", default=None,
        help="add this run to FILE's baseline (created if absent); record three or more",
    )  # fmt: skip


def _load(path: Path) -> Baseline:
    """The baseline in ``path``; ``NotComparable`` when there is none to read."""
    try:
        return Baseline.from_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NotComparable(f"cannot read the baseline {path}: {exc}") from None


def record(path: Path, run: Run) -> Baseline:
    """``run`` added to ``path``'s baseline (a new one when the file is absent); another
    workload than its runs' is ``NotComparable``."""
    stored = _load(path) if path.exists() else Baseline()
    if stored.runs:
        baseline.check_comparable(stored, run, min_runs=1)
    stored.runs.append(run)
    try:
        path.write_text(stored.to_json() + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--record-baseline: cannot write {path}: {exc}") from None
    return stored


def _row(f: Finding) -> str:
    verdict = "REGRESSED" if f.regressed else "within"
    change = "-" if math.isnan(f.change) else f"{f.change:+.1%}"  # from 0: no share of it
    return (f"{f.quantity:<14} {f.band.mean:>10.4g} {f.band.upper:>10.4g} {f.value:>10.4g} "
            f"{change:>8}  {verdict}")  # fmt: skip


def table(findings: list[Finding]) -> str:
    head = f"{'quantity':<14} {'baseline':>10} {'band to':>10} {'this run':>10} {'change':>8}"
    return "\n".join([head, *(_row(f) for f in findings)])


def to_json(outcome: str, findings: list[Finding], why: str = "", runs: int = 0) -> str:
    doc: dict[str, Any] = {
        "outcome": outcome, "baseline_runs": runs,
        "quantities": [{"quantity": f.quantity, "value": f.value, "baseline_mean": f.band.mean,
                        "baseline_sd": f.band.sd, "band_upper": f.band.upper,
                        "change": f.change, "regressed": f.regressed} for f in findings],
    }  # fmt: skip
    if why:
        doc["why"] = why
    return json.dumps(doc, indent=2)


def run_baseline_cli(args: argparse.Namespace, source: Source, out: TextIO, err: TextIO) -> int:
    """Record or compare, as the flags say; the exit code."""
    try:
        run = baseline.run_of(source.read(baseline.queries(source.window or "1h")))
        if args.record_baseline:
            stored = record(Path(args.record_baseline), run)
            if args.json:
                print(json.dumps({"outcome": "recorded", "baseline_runs": len(stored.runs),
                                  "requests": run.requests}), file=out)  # fmt: skip
            else:
                print(f"recorded run {len(stored.runs)} of {args.record_baseline} "
                      f"({run.requests:g} requests from {source})", file=out)  # fmt: skip
            return 0
        stored = _load(Path(args.baseline))
        baseline.check_comparable(stored, run)
    except NotComparable as exc:
        print(f"llmobs slo: not comparable: {exc}.", file=err)
        if args.json:
            print(to_json("not_comparable", [], str(exc)), file=out)
        return 2
    findings = baseline.compare(stored, run)
    regressed = [f for f in findings if f.regressed]
    if args.json:
        print(to_json("regressed" if regressed else "within", findings, runs=len(stored.runs)),
              file=out)  # fmt: skip
    else:
        print(f"against the baseline of {len(stored.runs)} runs in {args.baseline} "
              f"({source}):", file=out)  # fmt: skip
        print(table(findings), file=out)
        for finding in regressed:
            print(f"regression: {finding.says()}", file=out)
        print("within the baseline's noise" if not regressed else "regressed", file=out)
    return 1 if regressed else 0
