"""Metric names in PromQL expressions, and the names our dashboards and rules may use.

No PromQL parser runs in Python, and Prometheus 2.42 has no parse endpoint, so names are found
lexically, in an order that makes each step safe: string literals are blanked (after reading
any ``__name__="..."`` matcher), then label matchers ``{...}``, ranges and subqueries
``[...]`` and grouping clauses ``by (...)``, ``on (...)``, ``group_left (...)`` are dropped;
what is left are functions and aggregations (an identifier followed by ``(``), keywords,
numbers and durations (which start with a digit), and metric names. Grafana variables
(``$model``, ``${pod}``, ``[[x]]``) are read as numbers. A regex match on ``__name__`` cannot be
checked and raises.
"""

from __future__ import annotations

import re

from llmobs.metrics.catalogue import CATALOGUE, Kind

_STRING = r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`'
_NAME_MATCHER = re.compile(r"__name__\s*(=~|!=|!~|=)\s*(" + _STRING + ")")
_STRINGS = re.compile(_STRING)
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "inf", "nan"}
)  # fmt: skip
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.*),)?\s*(?P<label>\w+)\s*\)\s*$")

# Names Prometheus itself writes for every scrape target.
SYNTHETIC = frozenset({"up"})


def metric_names(expr: str) -> set[str]:
    """Every metric name that ``expr`` selects."""
    names: set[str] = set()
    for op, literal in _NAME_MATCHER.findall(expr):
        if op != "=":
            raise ValueError(f"a {op} match on __name__ cannot be checked: {expr}")
        names.add(literal[1:-1])
    text = _STRINGS.sub('""', expr)
    text = _VARIABLE.sub("0", text)
    text = _BRACES.sub(" ", text)
    while _BRACKETS.search(text):
        text = _BRACKETS.sub(" ", text)
    while _GROUPING.search(text):
        text = _GROUPING.sub(" ", text)
    for match in _IDENT.finditer(text):
        word = match.group(0)
        if word.lower() in _KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(word)
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
