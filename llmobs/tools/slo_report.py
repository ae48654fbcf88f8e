"""``llmobs slo``: attainment, goodput and misses per objective, per model, and a CI gate.

Reads a running sidecar's ``/metrics`` (the counts since it started) or a Prometheus server
over a time range (every sidecar it scrapes, summed), and prints per operation and model: the
requests judged, the share good against the target each sidecar exports, the good output
tokens, and the misses by objective; with ``--by pod`` (Prometheus), which pods hold the
misses. Exits 1 when any label set is below its target: run a load test through llmobs, then
this, and a latency regression fails the build. Exits 2 when it
cannot judge (``CannotJudge``: nothing judged yet, the source unreachable, a token missing or
refused, an answer that is not metrics), so that a gate never passes on nothing measured.

The parsing and the table are pure (``rows_from_metrics``, ``rows_from_vectors``, ``render``);
only ``fetch_metrics`` and ``query_prometheus`` do I/O (urllib: a CLI, no event loop).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from llmobs.config.objectives import Objective
from llmobs.config.options import ConfigError
from llmobs.export.metrics.catalogue import (
    COST,
    SLO_MISSES,
    SLO_OUTPUT_TOKENS,
    SLO_REQUESTS,
    SLO_TARGET,
)

_OP, _MODEL, _TENANT = "gen_ai_operation_name", "gen_ai_request_model", "tenant"
_RANGE = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # a Prometheus label name
T = TypeVar("T")
Key = tuple[str, str, str]  # (operation, model, tenant: "" when tenants are not labelled)


@dataclass
class Row:
    """One label set's SLO figures."""

    good: float = 0.0
    bad: float = 0.0
    good_tokens: float = 0.0
    tokens: float = 0.0
    target: float | None = None
    misses: dict[str, float] = field(default_factory=dict)
    cost: float | None = None  # what its tokens cost (None: no price file)
    bad_cost: float = 0.0  # of which the bad requests'

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
    key = (labels.get(_OP, ""), labels.get(_MODEL, ""), labels.get(_TENANT, ""))
    row = rows.setdefault(key, Row())
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
    elif name == COST.prometheus:
        row.cost = (row.cost or 0.0) + value
        if verdict == "bad":
            row.bad_cost += value


def _judged(rows: dict[Key, Row]) -> dict[Key, Row]:
    """The label sets with requests judged (the others: health checks, 4xx only, ...)."""
    return {key: row for key, row in rows.items() if row.judged > 0}


def rows_from_metrics(text: str) -> dict[Key, Row]:
    """The SLO rows of one sidecar's /metrics text (counts since it started), of the label
    sets with requests judged."""
    return _sidecar_rows(text)[0]


def _sidecar_rows(text: str) -> tuple[dict[Key, Row], bool]:
    """``rows_from_metrics``, and whether the page has any llmobs series (a sidecar's does,
    an engine's does not); ``ValueError`` when it is not in the exposition format."""
    rows: dict[Key, Row] = {}
    names = {m.prometheus for m in (SLO_REQUESTS, SLO_OUTPUT_TOKENS, SLO_MISSES, SLO_TARGET, COST)}
    ours = False
    for family in text_string_to_metric_families(text):
        ours = ours or family.name.startswith("llmobs_")
        for sample in family.samples:
            if sample.name in names:
                _add(rows, sample.labels, sample.name, float(sample.value))
    return _judged(rows), ours


def rows_from_vectors(
    vectors: Mapping[str, Iterable[tuple[Mapping[str, str], float]]],
) -> dict[Key, Row]:
    """The SLO rows of Prometheus query results: family name -> (labels, value) samples."""
    rows: dict[Key, Row] = {}
    for name, samples in vectors.items():
        for labels, value in samples:
            _add(rows, labels, name, value)
    return _judged(rows)


Breakdown = dict[tuple[Key, str], Row]  # (label set, a value of the --by label): its row


def breakdown_from_vectors(
    vectors: Mapping[str, Iterable[tuple[Mapping[str, str], float]]], by: Sequence[str]
) -> Breakdown:
    """The SLO rows per label set and values of ``by`` (a pod: its namespace and name,
    joined by "/"), of those with bad requests: where the misses are."""
    split: dict[str, dict[str, list[tuple[Mapping[str, str], float]]]] = {}
    for name, samples in vectors.items():
        for labels, value in samples:
            where = "/".join(labels.get(label, "") for label in by)
            split.setdefault(where, {}).setdefault(name, []).append((labels, value))
    return {
        (key, where): row
        for where, part in split.items()
        for key, row in rows_from_vectors(part).items()
        if row.bad > 0
    }


def render_breakdown(rows: Breakdown, by: str) -> str:
    """Where the misses are: per label set, each ``by`` value with bad requests, the most
    first."""
    tenants = any(key[2] for key, _ in rows)
    header = ("operation", "model", *(("tenant",) if tenants else ()), by, "judged", "bad",
              "share bad", "misses")  # fmt: skip
    lines = [header]
    for ((op, model, tenant), where), row in sorted(
        rows.items(), key=lambda item: (item[0][0], -item[1].bad, item[0][1])
    ):
        lines.append((
            op, model, *((tenant,) if tenants else ()), where, f"{row.judged:.0f}",
            f"{row.bad:.0f}", _pct(row.bad / row.judged), _misses(row) or "-",
        ))  # fmt: skip
    return _table(lines)


def _table(lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]  # fmt: skip
    return "\n".join(text)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3%}"


def render(rows: Mapping[Key, Row], target: float | None = None) -> str:
    """The table: one line per label set, then the verdict; a tenant column when tenants are
    labelled, a cost column when requests are priced."""
    tenants = any(tenant for _, _, tenant in rows)
    priced = any(row.cost is not None for row in rows.values())
    header = ("operation", "model", *(("tenant",) if tenants else ()), "judged", "good",
              "attainment", "target", "met", "good tokens", *(("cost (bad)",) if priced else ()),
              "misses")  # fmt: skip
    lines = [header]
    for (op, model, tenant), row in sorted(rows.items()):
        goal = target if target is not None else row.target
        tokens = f"{row.good_tokens:.0f}/{row.tokens:.0f}" if row.tokens else "-"
        cost = f"{row.cost or 0:.2f} ({row.bad_cost:.2f})" if row.cost is not None else "-"
        lines.append((
            op, model, *((tenant,) if tenants else ()), f"{row.judged:.0f}", f"{row.good:.0f}",
            _pct(row.attainment), _pct(goal), "yes" if row.met(target) else "NO", tokens,
            *((cost,) if priced else ()), _misses(row) or "-",
        ))  # fmt: skip
    return _table(lines)


def _misses(row: Row) -> str:
    order = [o.value for o in Objective]
    return ", ".join(
        f"{name} {row.misses[name]:.0f}"
        for name in sorted(row.misses, key=lambda n: order.index(n) if n in order else 99)
        if row.misses[name] > 0
    )


def passed(rows: Mapping[Key, Row], target: float | None = None) -> bool:
    """Whether there is something judged and every label set meets its target."""
    return bool(rows) and all(row.met(target) for row in rows.values())


def outcome(rows: Mapping[Key, Row], target: float | None = None) -> str:
    """``met`` (exit 0), ``missed`` (1) or ``unjudged`` (2: nothing to judge by)."""
    if not rows:
        return "unjudged"
    return "met" if passed(rows, target) else "missed"


def as_json(
    rows: Mapping[Key, Row],
    target: float | None = None,
    error: str = "",
    breakdown: tuple[str, Breakdown] | None = None,
) -> str:
    """The report for tools: ``passed``, ``outcome``, ``error`` (why it is unjudged), the
    label sets, and with ``breakdown`` (the --by label, its rows) where the misses are."""
    out = [
        {
            "operation": op, "model": model, **({"tenant": tenant} if tenant else {}),
            "judged": row.judged, "good": row.good,
            "bad": row.bad, "attainment": row.attainment,
            "target": target if target is not None else row.target, "met": row.met(target),
            "good_output_tokens": row.good_tokens, "output_tokens": row.tokens,
            "misses": row.misses,
            **({"cost": row.cost, "bad_cost": row.bad_cost} if row.cost is not None else {}),
        }
        for (op, model, tenant), row in sorted(rows.items())
    ]  # fmt: skip
    report: dict[str, Any] = {"passed": passed(rows, target), "outcome": outcome(rows, target)}
    if error:
        report["error"] = error
    report["label_sets"] = out
    if breakdown is not None:
        by, split = breakdown
        report["misses_by"] = {"label": by, "label_sets": [
            {"operation": op, "model": model, **({"tenant": tenant} if tenant else {}),
             by: where, "judged": row.judged, "bad": row.bad, "misses": row.misses}
            for ((op, model, tenant), where), row in sorted(split.items())
        ]}  # fmt: skip
    return json.dumps(report, indent=2)


# -- I/O -------------------------------------------------------------------------------------

TOKEN_ENV = "LLMOBS_METRICS_TOKEN"  # the sidecar's own variable for it (``serve``)
EXIT_CODES = (
    "Exit codes: 0 every objective met; 1 a label set below its target; 2 could not judge: "
    "no request judged yet, the source unreachable, a metrics token missing or refused "
    "(--metrics-token / LLMOBS_METRICS_TOKEN), or an answer that is not metrics. With --json "
    'the report says which as "outcome": met, missed or unjudged.'
)
_SIDECAR_FIX = "check that the sidecar is up and that --metrics-url is its /metrics"
_PROMETHEUS_FIX = (
    "check that Prometheus is up and that --prometheus is its base URL (http://prometheus:9090)"
)


class CannotJudge(Exception):
    """Nothing to judge by: the source unreachable, refused, not metrics, or no request judged
    (exit 2). The message says where and what to do."""


@dataclass(frozen=True)
class _Answer:
    status: int
    reason: str
    body: bytes


def _why(url: str, exc: BaseException, timeout: float) -> str:
    """Why ``url`` gave no answer, for people."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return f"nothing is listening at {url} (connection refused)"
    if isinstance(reason, TimeoutError):
        return f"{url} did not answer within {timeout:g} s"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host of {url} ({reason.strerror})"
    return f"cannot read {url} ({reason or type(reason).__name__})"


def _get(url: str, headers: Mapping[str, str], timeout: float, fix: str, name: str = "") -> _Answer:
    """GET ``url``: its answer, whatever its status; no answer at all is ``CannotJudge``
    naming ``name`` (default: the URL) and saying what to do (``fix``)."""
    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return _Answer(response.status, str(response.reason), response.read())
    except urllib.error.HTTPError as exc:  # a status other than 2xx: an answer too
        with exc:
            return _Answer(exc.code, str(exc.reason), _rest(exc))
    except (OSError, http.client.HTTPException) as exc:
        raise CannotJudge(f"{_why(name or url, exc, timeout)}: {fix}") from None


def _rest(response: urllib.error.HTTPError) -> bytes:
    """The body of an answer that is not a 2xx (Prometheus says there why it refused)."""
    try:
        return response.read()
    except (OSError, http.client.HTTPException):
        return b""


def check_url(flag: str, url: str) -> None:
    """An http(s) URL, or a ``ConfigError`` naming ``flag``."""
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{flag}: expected an http(s) URL, got {url!r}")


def fetch_metrics(url: str, token: str = "", timeout: float = 10.0) -> str:
    """A sidecar's /metrics text; ``CannotJudge`` when it cannot be read."""
    headers = {"Accept": "text/plain"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    answer = _get(url, headers, timeout, _SIDECAR_FIX)
    if answer.status in (401, 403) and not token:
        raise CannotJudge(
            f"{url} requires a metrics token (HTTP {answer.status}): pass the sidecar's token "
            f"to llmobs slo with --metrics-token or {TOKEN_ENV}"
        )
    if answer.status in (401, 403):
        raise CannotJudge(
            f"{url} refused the metrics token given (HTTP {answer.status}): pass the one the "
            f"sidecar was started with, with --metrics-token or {TOKEN_ENV}"
        )
    if not 200 <= answer.status < 300:
        raise CannotJudge(
            f"{url} answered HTTP {answer.status} {answer.reason}: point --metrics-url at a "
            "sidecar's /metrics (on its --metrics-port)"
        )
    try:
        return answer.body.decode("utf-8")
    except UnicodeDecodeError:
        raise CannotJudge(_not_metrics(url)) from None


def _not_metrics(url: str) -> str:
    return (
        f"{url} answered with something that is not a Prometheus metrics page: point "
        "--metrics-url at a sidecar's /metrics (on its --metrics-port)"
    )


def read_sidecar(url: str, token: str = "", timeout: float = 10.0) -> dict[Key, Row]:
    """The rows of a sidecar's /metrics; ``CannotJudge`` when there are none to judge by."""
    text = fetch_metrics(url, token, timeout)
    try:
        rows, ours = _sidecar_rows(text)
    except ValueError:  # the parser's word for a line that is not exposition format
        raise CannotJudge(_not_metrics(url)) from None
    if not ours:
        raise CannotJudge(
            f"{url} is not an llmobs sidecar's /metrics (no llmobs_ series): point "
            "--metrics-url at the sidecar's --metrics-port, not the engine's"
        )
    if not rows:
        raise CannotJudge(
            f"no request judged yet at {url}: send requests through the sidecar (a 4xx or a "
            "client that left is not judged), then run llmobs slo again"
        )
    return rows


def _queries(window: str, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The SLO families summed per label set over ``window`` (and per ``extra`` labels)."""
    by = ", ".join((_OP, _MODEL, _TENANT, *extra))  # (a series without a tenant has it empty)
    out = {
        metric.prometheus: f"sum by ({by}, {label}) (increase({metric.prometheus}[{window}]))"
        for metric, label in (
            (SLO_REQUESTS, "verdict"), (SLO_OUTPUT_TOKENS, "verdict"), (SLO_MISSES, "objective"),
            (COST, "verdict"),
        )
    }  # fmt: skip
    target = SLO_TARGET.prometheus
    out[target] = f"max by ({by}) (max_over_time({target}[{window}]))"
    return out


def _vector(base: str, answer: _Answer, query: str) -> list[tuple[dict[str, str], float]]:
    """The samples of a Prometheus instant query's answer; ``CannotJudge`` when it is an
    error or not the query API's."""
    try:
        data: Any = json.loads(answer.body)
        if data["status"] != "success":
            raise CannotJudge(
                f"Prometheus at {base} refused the query {query!r} (HTTP {answer.status}): "
                f"{data.get('error')}; check --range and --end"
            )
        return [(s["metric"], float(s["value"][1])) for s in data["data"]["result"]]
    except (ValueError, TypeError, KeyError, IndexError):
        raise CannotJudge(
            f"{base} answered HTTP {answer.status} {answer.reason}, not as Prometheus's query "
            f"API: {_PROMETHEUS_FIX}"
        ) from None


def query_prometheus(
    base: str,
    window: str,
    end: float | None = None,
    timeout: float = 30.0,
    queries: Mapping[str, str] | None = None,
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The SLO families (or ``queries``: family name -> PromQL) summed over every sidecar
    Prometheus scrapes, over ``window`` up to ``end`` (unix seconds; None: now);
    ``CannotJudge`` when Prometheus cannot answer."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, query in (queries if queries is not None else _queries(window)).items():
        params = {"query": query}
        if end is not None:
            params["time"] = f"{end:.3f}"
        url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}"
        answer = _get(url, {"Accept": "application/json"}, timeout, _PROMETHEUS_FIX, base)
        out[name] = _vector(base, answer, query)
    return out


def read_report(
    base: str, window: str, end: float | None = None, by: Sequence[str] = ()
) -> tuple[dict[Key, Row], Breakdown | None]:
    """The rows of every sidecar Prometheus scrapes, over ``window``, and with ``by`` where
    their misses are (one round of queries: the rows are the breakdown's sums);
    ``CannotJudge`` when there are none to judge by."""
    vectors = query_prometheus(base, window, end, queries=_queries(window, tuple(by)))
    rows = rows_from_vectors(vectors)
    if not rows:
        raise CannotJudge(
            f"no request judged at {base} over the last {window}: check that Prometheus "
            f"scrapes the sidecars ({SLO_REQUESTS.prometheus}) and that requests ran then"
        )
    return rows, breakdown_from_vectors(vectors, by) if by else None


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


def token_of(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """The metrics token: the flag's, else the environment's."""
    token: str | None = args.metrics_token
    return token if token is not None else environ.get(TOKEN_ENV, "")


def checked_range(args: argparse.Namespace) -> str:
    """``--range`` and ``--prometheus``, checked: the window."""
    window: str = args.range
    if not _RANGE.fullmatch(window):
        raise ConfigError(f"--range: not a Prometheus duration (5m, 1h, 28d): {window!r}")
    check_url("--prometheus", args.prometheus)
    return window


def read_source(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    sidecar: Callable[[str, str], T],
    prometheus: Callable[[str, str, float | None], T],
) -> tuple[T, str]:
    """What ``add_source_arguments``' flags name, read by ``sidecar`` (URL, token) or
    ``prometheus`` (base URL, window, end), and where it came from: ``llmobs slo``'s and
    ``llmobs why``'s."""
    if args.metrics_url:
        check_url("--metrics-url", args.metrics_url)
        return sidecar(args.metrics_url, token_of(args, environ)), args.metrics_url
    window = checked_range(args)
    return prometheus(args.prometheus, window, args.end), f"{args.prometheus}, the last {window}"


Report = tuple[dict[Key, Row], Breakdown | None]


def _read(
    args: argparse.Namespace, environ: Mapping[str, str], by: Sequence[str]
) -> tuple[Report, str]:
    """The rows to judge (and, ``by`` labels, where their misses are), and where they come
    from."""

    def sidecar(url: str, token: str) -> Report:
        return read_sidecar(url, token), None

    def prometheus(base: str, window: str, end: float | None) -> Report:
        return read_report(base, window, end, by)

    return read_source(args, environ, sidecar, prometheus)


_GROUPED = frozenset({_OP, _MODEL, _TENANT, "verdict", "objective", "cause", "currency"})


def _by_labels(args: argparse.Namespace) -> tuple[str, ...]:
    """``--by``'s labels, checked: target labels (not those the report already splits by),
    with --prometheus only."""
    by = tuple(label.strip() for label in str(args.by).split(",") if label.strip())
    for label in by:
        if args.metrics_url or not _LABEL.fullmatch(label) or label in _GROUPED:
            raise ConfigError(
                "--by: target labels (pod, or namespace,pod; not one the report splits by), "
                f"with --prometheus only: {label!r}"
            )
    return by


def run_slo_cli(
    args: argparse.Namespace, out: Any, environ: Mapping[str, str] | None = None
) -> int:
    """Print the report; 0 when every label set meets its target, 1 when one does not, 2
    when there is nothing to judge by (why: one sentence on stderr, and in the JSON)."""
    if args.target is not None and not 0 < args.target < 1:
        raise ConfigError("--target: must be above 0 and below 1")
    by = _by_labels(args)
    try:
        (rows, split), source = _read(args, os.environ if environ is None else environ, by)
    except CannotJudge as exc:
        print(f"llmobs slo: cannot judge: {exc}.", file=sys.stderr)
        if args.json:
            print(as_json({}, args.target, str(exc)), file=out)
        return 2
    ok = passed(rows, args.target)
    if args.json:
        breakdown = (",".join(by), split) if split is not None else None
        print(as_json(rows, args.target, breakdown=breakdown), file=out)
    else:
        print(f"service-level objectives ({source}):", file=out)
        print(render(rows, args.target), file=out)
        if split is not None:
            print(f"\nwhere the bad requests are, by {','.join(by)}:", file=out)
            print(render_breakdown(split, "/".join(by)) if split else "(none)", file=out)
        print("all objectives met" if ok else "objectives missed", file=out)
    return 0 if ok else 1
