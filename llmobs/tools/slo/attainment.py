"""``llmobs slo``'s figures (pure): per operation, model and tenant, the requests judged good
and bad, the target each sidecar exports, the good output tokens, the misses by objective and
the cost; with ``--by``, the same split by a target label (which pods hold the misses).

Samples in (``samples.Sample``, from either source), ``Row`` per label set out; the PromQL
that asks Prometheus for the same families summed over a window is here too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmobs.export.metrics.catalogue import (
    COST,
    SLO_MISSES,
    SLO_OUTPUT_TOKENS,
    SLO_REQUESTS,
    SLO_TARGET,
)
from llmobs.tools.slo.samples import MODEL, OPERATION, TENANT, Sample, page_samples

Key = tuple[str, str, str]  # (operation, model, tenant: "" when tenants are not labelled)

_REQUESTS, _TOKENS, _MISSES = (
    SLO_REQUESTS.prometheus, SLO_OUTPUT_TOKENS.prometheus, SLO_MISSES.prometheus,
)  # fmt: skip
_TARGET, _COST = SLO_TARGET.prometheus, COST.prometheus
FAMILIES = frozenset({_REQUESTS, _TOKENS, _MISSES, _TARGET, _COST})  # those the report reads
# the labels the report splits by: --by may not name them
GROUPED = frozenset({OPERATION, MODEL, TENANT, "verdict", "objective", "cause", "currency"})


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
    currency: str = ""  # the price file's, as the cost series name it

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

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        """One sample of an SLO family, by its name."""
        verdict = labels.get("verdict")
        if name == _REQUESTS:
            self._judged(verdict, value)
        elif name == _TOKENS:
            self.tokens += value
            if verdict == "good":
                self.good_tokens += value
        elif name == _MISSES:
            objective = labels.get("objective", "")
            self.misses[objective] = self.misses.get(objective, 0.0) + value
        elif name == _TARGET:
            self.target = value if self.target is None else max(self.target, value)
        elif name == _COST:
            self.cost = (self.cost or 0.0) + value
            self.currency = labels.get("currency", self.currency)
            if verdict == "bad":
                self.bad_cost += value

    def _judged(self, verdict: str | None, value: float) -> None:
        if verdict == "good":
            self.good += value
        elif verdict == "bad":
            self.bad += value


Breakdown = dict[tuple[Key, str], Row]  # (label set, a value of the --by label): its row
Report = tuple[dict[Key, Row], Breakdown | None]  # the rows, and with --by where the misses are


def rows_from_samples(samples: Iterable[Sample]) -> dict[Key, Row]:
    """The SLO rows of the samples, of the label sets with requests judged (not those of
    health checks, 4xx only, ...)."""
    out: dict[Key, Row] = {}
    for name, labels, value in samples:
        if math.isfinite(value):
            key = (labels.get(OPERATION, ""), labels.get(MODEL, ""), labels.get(TENANT, ""))
            out.setdefault(key, Row()).add(name, labels, value)
    return {key: row for key, row in out.items() if row.judged > 0}


def rows_from_metrics(text: str) -> dict[Key, Row]:
    """The SLO rows of one sidecar's /metrics text (counts since it started)."""
    return rows_from_samples(page_samples(text, FAMILIES)[0])


def breakdown(samples: Iterable[Sample], by: Sequence[str]) -> Breakdown:
    """The SLO rows per label set and values of ``by`` (a pod: its namespace and name,
    joined by "/"), of those with bad requests: where the misses are."""
    split: dict[str, list[Sample]] = {}
    for sample in samples:
        where = "/".join(sample[1].get(label, "") for label in by)
        split.setdefault(where, []).append(sample)
    return {
        (key, where): row
        for where, part in split.items()
        for key, row in rows_from_samples(part).items()
        if row.bad > 0
    }


def passed(rows: Mapping[Key, Row], target: float | None = None) -> bool:
    """Whether there is something judged and every label set meets its target."""
    return bool(rows) and all(row.met(target) for row in rows.values())


def outcome(rows: Mapping[Key, Row], target: float | None = None) -> str:
    """``met`` (exit 0), ``missed`` (1) or ``unjudged`` (2: nothing to judge by)."""
    if not rows:
        return "unjudged"
    return "met" if passed(rows, target) else "missed"


def queries(window: str, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The SLO families summed per label set over ``window`` (and per ``extra`` labels), as
    PromQL: family name -> query."""
    by = ", ".join((OPERATION, MODEL, TENANT, *extra))  # (a series without a tenant has it empty)
    out = {
        name: f"sum by ({by}, {label}) (increase({name}[{window}]))"
        for name, label in (
            (_REQUESTS, "verdict"), (_TOKENS, "verdict"), (_MISSES, "objective"),
            (_COST, "verdict"),
        )
    }  # fmt: skip
    out[_TARGET] = f"max by ({by}) (max_over_time({_TARGET}[{window}]))"
    return out
