"""``llmobs slo`` and ``llmobs why``: their flags, and each run from a source to its report.

``slo`` prints attainment, goodput and misses per label set and is a CI gate: exit 1 when any
label set is below its target (a latency regression fails the build), 2 when it cannot judge
(``CannotJudge``), so that a gate never passes on nothing measured. ``why`` prints why
requests were slow; exit 2 when there is nothing to report from. Both read their source
(``sources.Source``) the same way; each says in its own words when it found nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from llmobs.config.options import ConfigError
from llmobs.export.metrics.catalogue import SLO_REQUESTS
from llmobs.tools.slo import attainment, reasons, render
from llmobs.tools.slo.gate import BASELINE_EXIT_CODES, add_baseline_arguments, run_baseline_cli
from llmobs.tools.slo.gate import to_json as gate_json
from llmobs.tools.slo.sources import TOKEN_ENV, CannotJudge, Source, check_url

EXIT_CODES = (
    "Exit codes: 0 every objective met; 1 a label set below its target; 2 could not judge: "
    "no request judged yet, the source unreachable, a metrics token missing or refused "
    "(--metrics-token / LLMOBS_METRICS_TOKEN), or an answer that is not metrics. With --json "
    'the report says which as "outcome": met, missed or unjudged. ' + BASELINE_EXIT_CODES
)
_RANGE = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # a Prometheus label name


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the figures come from (a sidecar's /metrics, or Prometheus over a range), and
    ``--json``: ``llmobs slo``'s and ``llmobs why``'s."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--metrics-url", metavar="URL", help="a sidecar's /metrics (counts since it started)"
    )
    source.add_argument("--prometheus", metavar="URL", help="a Prometheus server's base URL")
    parser.add_argument(
        "--range", default="1h", metavar="DURATION",
        help="with --prometheus: the window up to --end (1h, 28d) [1h]",
    )  # fmt: skip
    parser.add_argument(
        "--end", type=float, default=None, metavar="UNIX_SECONDS",
        help="with --prometheus: the end of the window [now]",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-token", default=None, metavar="TOKEN",
        help=f"bearer token for --metrics-url: the sidecar's --metrics-token [env {TOKEN_ENV}]",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_slo_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument(
        "--target", type=float, default=None, metavar="RATIO",
        help="hold every label set to this share good (default: the target each exports)",
    )  # fmt: skip
    parser.add_argument(
        "--by", default="", metavar="LABELS",
        help="with --prometheus: also say which values of these target labels (pod, or "
        "namespace,pod; instance) hold each label set's bad requests",
    )  # fmt: skip
    add_baseline_arguments(parser)


def source_of(args: argparse.Namespace, environ: Mapping[str, str]) -> Source:
    """The source ``add_source_arguments``' flags name, checked; the metrics token is the
    flag's, else the environment's."""
    if args.metrics_url:
        check_url("--metrics-url", args.metrics_url)
        token: str | None = args.metrics_token
        return Source(args.metrics_url, token if token is not None else environ.get(TOKEN_ENV, ""))
    window: str = args.range
    if not _RANGE.fullmatch(window):
        raise ConfigError(f"--range: not a Prometheus duration (5m, 1h, 28d): {window!r}")
    check_url("--prometheus", args.prometheus)
    return Source(args.prometheus, window=window, end=args.end)


def _by_labels(args: argparse.Namespace) -> tuple[str, ...]:
    """``--by``'s labels, checked: target labels (not those the report already splits by),
    with --prometheus only."""
    by = tuple(label.strip() for label in str(args.by).split(",") if label.strip())
    for label in by:
        if args.metrics_url or not _LABEL.fullmatch(label) or label in attainment.GROUPED:
            raise ConfigError(
                "--by: target labels (pod, or namespace,pod; not one the report splits by), "
                f"with --prometheus only: {label!r}"
            )
    return by


def judge(source: Source, by: tuple[str, ...] = ()) -> attainment.Report:
    """The rows to judge (and, ``by`` labels, where their misses are; one round of queries:
    the rows are the breakdown's sums); ``CannotJudge`` when there are none."""
    samples = source.read(attainment.queries(source.window, by))
    rows = attainment.rows_from_samples(samples)
    if rows:
        return rows, attainment.breakdown(samples, by) if by else None
    if source.sidecar:
        raise CannotJudge(
            f"no request judged yet at {source.url}: send requests through the sidecar (a 4xx "
            "or a client that left is not judged), then run llmobs slo again"
        )
    raise CannotJudge(
        f"no request judged at {source.url} over the last {source.window}: check that "
        f"Prometheus scrapes the sidecars ({SLO_REQUESTS.prometheus}) and that requests ran then"
    )


def explain(source: Source) -> dict[reasons.Key, reasons.Why]:
    """Why requests were slow, as counted at ``source``; ``CannotJudge`` when nothing was."""
    rows = reasons.tally(source.read(reasons.queries(source.window)))
    if rows:
        return rows
    if source.sidecar:
        raise CannotJudge(
            f"nothing slow counted yet at {source.url}: no stall, no missed objective, no "
            "first token"
        )
    raise CannotJudge(f"nothing slow counted at {source.url} over the last {source.window}")


def run_slo_cli(
    args: argparse.Namespace, out: Any, environ: Mapping[str, str] | None = None
) -> int:
    """Print the report; 0 when every label set meets its target, 1 when one does not, 2
    when there is nothing to judge by (why: one sentence on stderr, and in the JSON)."""
    if args.target is not None and not 0 < args.target < 1:
        raise ConfigError("--target: must be above 0 and below 1")
    if args.baseline or args.record_baseline:
        return _baseline(args, source_of(args, os.environ if environ is None else environ), out)
    by = _by_labels(args)
    try:
        source = source_of(args, os.environ if environ is None else environ)
        rows, split = judge(source, by)
    except CannotJudge as exc:
        print(f"llmobs slo: cannot judge: {exc}.", file=sys.stderr)
        if args.json:
            print(render.slo_json({}, args.target, str(exc)), file=out)
        return 2
    ok = attainment.passed(rows, args.target)
    if args.json:
        breakdown = (",".join(by), split) if split is not None else None
        print(render.slo_json(rows, args.target, breakdown=breakdown), file=out)
    else:
        print(f"service-level objectives ({source}):", file=out)
        print(render.slo_table(rows, args.target), file=out)
        if split is not None:
            print(f"\nwhere the bad requests are, by {','.join(by)}:", file=out)
            print(render.breakdown_table(split, "/".join(by)) if split else "(none)", file=out)
        print("all objectives met" if ok else "objectives missed", file=out)
    return 0 if ok else 1


def _baseline(args: argparse.Namespace, source: Source, out: Any) -> int:
    """``--baseline`` or ``--record-baseline``: a source that cannot be read is exit 2."""
    try:
        return run_baseline_cli(args, source, out, sys.stderr)
    except CannotJudge as exc:
        print(f"llmobs slo: not comparable: {exc}.", file=sys.stderr)
        if args.json:
            print(gate_json("not_comparable", [], str(exc)), file=out)
        return 2


def run_why_cli(
    args: argparse.Namespace, out: Any, environ: Mapping[str, str] | None = None
) -> int:
    """Print the report; 0 with one, 2 when there is nothing to report from."""
    try:
        source = source_of(args, os.environ if environ is None else environ)
        rows = explain(source)
    except CannotJudge as exc:
        print(f"llmobs why: {exc}.", file=sys.stderr)
        if args.json:
            print(render.why_json({}, str(exc)), file=out)
        return 2
    if args.json:
        print(render.why_json(rows), file=out)
    else:
        print(f"why it was slow ({source}):", file=out)
        print(render.why_text(rows), file=out)
    return 0
