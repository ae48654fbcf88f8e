"""Metric names in PromQL expressions, and the names our dashboards and rules may use.

Expressions are parsed by ``promql-parser`` (the Rust crate of the same name, with Python
bindings: a real PromQL parser), every vector selector's name is read off the tree. Grafana's
variables are not PromQL: outside strings (``[$__rate_interval]``, ``[$slo_window]``) they are
replaced by a duration first; inside label matchers' strings they are just text. A regex
match on ``__name__`` cannot be checked and raises.
"""

from __future__ import annotations

import re

import promql_parser

from llmobs.export.metrics.catalogue import CATALOGUE, Kind

_STRING = r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`'
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_STRING_OR_VARIABLE = re.compile(f"({_STRING})|{_VARIABLE.pattern}")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.*),)?\s*(?P<label>\w+)\s*\)\s*$")

# Names Prometheus itself writes for every scrape target.
SYNTHETIC = frozenset({"up"})


def _without_variables(expr: str) -> str:
    """Grafana's variables outside strings replaced by a duration (where they stand)."""
    return _STRING_OR_VARIABLE.sub(lambda m: m.group(1) or "5m", expr)


def metric_names(expr: str) -> set[str]:
    """Every metric name that ``expr`` selects (a ``SyntaxError`` if it does not parse)."""
    try:
        tree = promql_parser.parse(_without_variables(expr))
    except ValueError as exc:
        raise SyntaxError(f"{exc}: {expr}") from exc
    names: set[str] = set()

    def visit(node: object) -> None:
        if not isinstance(node, promql_parser.VectorSelector):
            return
        if node.name:
            names.add(node.name)
        for matcher in node.matchers.matchers:
            if matcher.name != "__name__":
                continue
            if matcher.op != promql_parser.MatchOp.Equal:
                raise ValueError(f"a {matcher.op} match on __name__ cannot be checked: {expr}")
            names.add(matcher.value)

    promql_parser.walk(tree, visit)
    return names


def variable_selector(query: str) -> tuple[str | None, str]:
    """Split a Grafana ``label_values(selector, label)`` query; the selector may be absent."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"not a label_values() query: {query}")
    return match.group("selector"), match.group("label")


def catalogue_series() -> set[str]:
    """Every series name the sidecar exposes, from the catalogue (histograms: their parts,
    and the native histogram under the family's own name where the metric has one)."""
    names: set[str] = set()
    for metric in CATALOGUE:
        if metric.kind in (Kind.HISTOGRAM, Kind.TOKEN_HISTOGRAM):
            names.update(metric.prometheus + s for s in ("_bucket", "_sum", "_count"))
            if metric.native is not None:
                names.add(metric.prometheus)
        else:
            names.add(metric.prometheus)
    return names


def unknown_metrics(expr: str, allowed: set[str] | frozenset[str]) -> set[str]:
    """Names in ``expr`` that are neither in the catalogue nor in ``allowed``."""
    return metric_names(expr) - catalogue_series() - set(allowed)
