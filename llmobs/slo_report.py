"""``llmobs slo``: attainment, goodput and misses per objective, per model, and a CI gate.

Reads a running sidecar's ``/metrics`` (the counts since it started) or a Prometheus server
over a time range (every sidecar it scrapes, summed), and prints per operation and model: the
requests judged, the share good against the target each sidecar exports, the good output
tokens, and the misses by objective. Exits 1 when any label set is below its target: run a load
test through llmobs, then this, and a latency regression fails the build.

The parsing and the table are pure (``rows_from_metrics``, ``rows_from_vectors``, ``render``);
only ``fetch_metrics`` and ``query_prometheus`` do I/O (urllib: a CLI, no event loop).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llmobs.metrics.catalogue import SLO_MISSES, SLO_OUTPUT_TOKENS, SLO_REQUESTS, SLO_TARGET
from llmobs.options import ConfigError
from llmobs.slo import Objective

_OP, _MODEL = "gen_ai_operation_name", "gen_ai_request_model"
_RANGE = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
Key = tuple[str, str]


@dataclass
class Row:
    """One label set's SLO figures."""

    good: float = 0.0
    bad: float = 0.0
    good_tokens: float = 0.0
    tokens: float = 0.0
    target: float | None = None
    misses: dict[str, float] = field(default_factory=dict)

    @property
    def judged(self) -> float:
        return self.good + self.bad

    @property
    def attainment(self) -> float | None:
        return self.good / self.judged if self.judged else None

    def met(self, target: float | None = None) -> bool:
        """Whether the share good reaches ``target`` (default: the exported one); a label set
        with nothing judged meets it."""
        goal = target if target is not None else self.target
        share = self.attainment
        return share is None or goal is None or share >= goal


def _add(rows: dict[Key, Row], labels: Mapping[str, str], name: str, value: float) -> None:
    """One sample of an SLO family into its label set's row."""
    if not math.isfinite(value):
        return
    row = rows.setdefault((labels.get(_OP, ""), labels.get(_MODEL, "")), Row())
    verdict = labels.get("verdict")
    if name == SLO_REQUESTS.prometheus:
        if verdict == "good":
            row.good += value
        elif verdict == "bad":
            row.bad += value
    elif name == SLO_OUTPUT_TOKENS.prometheus:
        row.tokens += value
        if verdict == "good":
            row.good_tokens += value
    elif name == SLO_MISSES.prometheus:
        objective = labels.get("objective", "")
        row.misses[objective] = row.misses.get(objective, 0.0) + value
    elif name == SLO_TARGET.prometheus:
        row.target = value if row.target is None else max(row.target, value)


def _judged(rows: dict[Key, Row]) -> dict[Key, Row]:
    """The label sets with requests judged (the others: health checks, 4xx only, ...)."""
    return {key: row for key, row in rows.items() if row.judged > 0}


def rows_from_metrics(text: str) -> dict[Key, Row]:
    """The SLO rows of one sidecar's /metrics text (counts since it started), of the label
    sets with requests judged."""
    rows: dict[Key, Row] = {}
    names = {m.prometheus for m in (SLO_REQUESTS, SLO_OUTPUT_TOKENS, SLO_MISSES, SLO_TARGET)}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                _add(rows, sample.labels, sample.name, float(sample.value))
    return _judged(rows)


def rows_from_vectors(
    vectors: Mapping[str, Iterable[tuple[Mapping[str, str], float]]],
) -> dict[Key, Row]:
    """The SLO rows of Prometheus query results: family name -> (labels, value) samples."""
    rows: dict[Key, Row] = {}
    for name, samples in vectors.items():
        for labels, value in samples:
            _add(rows, labels, name, value)
    return _judged(rows)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3%}"


def render(rows: Mapping[Key, Row], target: float | None = None) -> str:
    """The table: one line per label set, then the verdict."""
    header = ("operation", "model", "judged", "good", "attainment", "target", "met",
              "good tokens", "misses")  # fmt: skip
    lines = [header]
    order = [o.value for o in Objective]
    for (op, model), row in sorted(rows.items()):
        misses = ", ".join(
            f"{name} {row.misses[name]:.0f}"
            for name in sorted(row.misses, key=lambda n: order.index(n) if n in order else 99)
            if row.misses[name] > 0
        )
        goal = target if target is not None else row.target
        tokens = f"{row.good_tokens:.0f}/{row.tokens:.0f}" if row.tokens else "-"
        lines.append((
            op, model, f"{row.judged:.0f}", f"{row.good:.0f}", _pct(row.attainment),
            _pct(goal), "yes" if row.met(target) else "NO", tokens, misses or "-",
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]  # fmt: skip
    return "\n".join(text)


def passed(rows: Mapping[Key, Row], target: float | None = None) -> bool:
    return all(row.met(target) for row in rows.values())


def as_json(rows: Mapping[Key, Row], target: float | None = None) -> str:
    out = [
        {
            "operation": op, "model": model, "judged": row.judged, "good": row.good,
            "bad": row.bad, "attainment": row.attainment,
            "target": target if target is not None else row.target, "met": row.met(target),
            "good_output_tokens": row.good_tokens, "output_tokens": row.tokens,
            "misses": row.misses,
        }
        for (op, model), row in sorted(rows.items())
    ]  # fmt: skip
    return json.dumps({"passed": passed(rows, target), "label_sets": out}, indent=2)


# -- I/O -------------------------------------------------------------------------------------


def fetch_metrics(url: str, token: str = "", timeout: float = 10.0) -> str:
    """A sidecar's /metrics text."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode("utf-8")


def _queries(window: str) -> dict[str, str]:
    by = f"{_OP}, {_MODEL}"
    out = {
        metric.prometheus: f"sum by ({by}, {label}) (increase({metric.prometheus}[{window}]))"
        for metric, label in (
            (SLO_REQUESTS, "verdict"), (SLO_OUTPUT_TOKENS, "verdict"), (SLO_MISSES, "objective"),
        )
    }  # fmt: skip
    target = SLO_TARGET.prometheus
    out[target] = f"max by ({by}) (max_over_time({target}[{window}]))"
    return out


def query_prometheus(
    base: str, window: str, end: float | None = None, timeout: float = 30.0
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The SLO families summed over every sidecar Prometheus scrapes, over ``window`` up to
    ``end`` (unix seconds; None: now)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, query in _queries(window).items():
        params = {"query": query}
        if end is not None:
            params["time"] = f"{end:.3f}"
        url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data: Any = json.load(response)
        if data.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {query!r}: {data.get('error')}")
        out[name] = [(s["metric"], float(s["value"][1])) for s in data["data"]["result"]]
    return out


def add_slo_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics-url", help="a sidecar's /metrics (counts since it started)")
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
        "--target", type=float, default=None, metavar="RATIO",
        help="hold every label set to this share good (default: the target each exports)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-token", default="", metavar="TOKEN",
        help="bearer token for --metrics-url (the sidecar's --metrics-token)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_slo_cli(args: argparse.Namespace, out: Any) -> int:
    """Print the report; 0 when every label set meets its target, 1 when one does not."""
    if args.target is not None and not 0 < args.target < 1:
        raise ConfigError("--target: must be above 0 and below 1")
    if args.metrics_url:
        rows = rows_from_metrics(fetch_metrics(args.metrics_url, args.metrics_token))
        source = args.metrics_url
    else:
        window = args.range
        if not _RANGE.fullmatch(window):
            raise ConfigError(f"--range: not a Prometheus duration (5m, 1h, 28d): {window!r}")
        rows = rows_from_vectors(query_prometheus(args.prometheus, window, args.end))
        source = f"{args.prometheus}, the last {window}"
    ok = passed(rows, args.target)
    if args.json:
        print(as_json(rows, args.target), file=out)
    elif not rows:
        print(f"no requests judged yet ({source})", file=out)
    else:
        print(f"service-level objectives ({source}):", file=out)
        print(render(rows, args.target), file=out)
        print("all objectives met" if ok else "objectives missed", file=out)
    return 0 if ok else 1
