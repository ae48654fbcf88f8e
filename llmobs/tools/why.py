"""``llmobs why``: why requests were slow, from the causes the sidecars counted.

Reads a running sidecar's ``/metrics`` (since it started) or Prometheus over a range (every
sidecar it scrapes, summed) and says, per operation and model and in all: where the TTFT
misses went (the phase that took most of each missed TTFT), why the gap and stall misses
happened (the cause of each request's longest stall), the stalls by cause, and the share of
all TTFT spent in each phase. The figures are the sidecars' own (``observe.causes``,
``observe.phases``); this only adds them up. ``--json`` for tools. Exit 0 with a report, 2
when there is nothing to report from (the errors of ``llmobs slo``: ``CannotJudge``).

Pure: ``tally`` (samples in, ``Why`` per label set out), ``render``, ``as_json``; the I/O is
``llmobs slo``'s (``slo_report``: a sidecar's page, Prometheus's query API).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llmobs.config.objectives import Objective
from llmobs.export.metrics.catalogue import SLO_MISSES, STALLS, TTFT_PHASE
from llmobs.observe.phases import Phase
from llmobs.tools.slo_report import (
    _MODEL,
    _OP,
    CannotJudge,
    fetch_metrics,
    query_prometheus,
    read_source,
)

Key = tuple[str, str]
Sample = tuple[str, Mapping[str, str], float]  # family name, labels, value
ALL: Key = ("all", "all")  # every label set together

_PHASE_SUM = TTFT_PHASE.prometheus + "_sum"
_GAP_OBJECTIVES = frozenset({Objective.MAX_GAP.value, Objective.STALL.value})
# the words a person reads for each cause, in the order they are listed when tied
PHASE_WORDS = {
    Phase.BEFORE_ENGINE.value: "before the engine", Phase.LOAD.value: "model load",
    Phase.QUEUE.value: "queue", Phase.PREFILL.value: "prefill", Phase.OTHER.value: "other",
    "none": "no phase known",
}  # fmt: skip
STALL_WORDS = {
    "prefill": "prefill interference", "preemption": "preemptions",
    "engine_pause": "engine pauses", "client": "client", "unknown": "unknown",
    "none": "no stall",
}  # fmt: skip


@dataclass
class Why:
    """One label set's counts: misses and stalls by cause, TTFT seconds by phase."""

    ttft_misses: dict[str, float] = field(default_factory=dict)
    gap_misses: dict[str, float] = field(default_factory=dict)
    stalls: dict[str, float] = field(default_factory=dict)
    ttft_seconds: dict[str, float] = field(default_factory=dict)

    def parts(self) -> dict[str, dict[str, float]]:
        return {"ttft_misses": self.ttft_misses, "gap_misses": self.gap_misses,
                "stalls": self.stalls, "ttft_seconds": self.ttft_seconds}  # fmt: skip

    @property
    def empty(self) -> bool:
        return not any(sum(part.values()) > 0 for part in self.parts().values())


def _add(into: dict[str, float], key: str, value: float) -> None:
    if value > 0:
        into[key] = into.get(key, 0.0) + value


def _count(why: Why, name: str, labels: Mapping[str, str], value: float) -> None:
    cause = labels.get("cause", "")
    if name == SLO_MISSES.prometheus:
        objective = labels.get("objective", "")
        if objective == Objective.TTFT.value:
            _add(why.ttft_misses, cause, value)
        elif objective in _GAP_OBJECTIVES:
            _add(why.gap_misses, cause, value)
    elif name == STALLS.prometheus:
        _add(why.stalls, cause, value)
    elif name == _PHASE_SUM:
        _add(why.ttft_seconds, labels.get("phase", ""), value)


def tally(samples: Iterable[Sample]) -> dict[Key, Why]:
    """Each label set's ``Why``, and all of them together under ``ALL``; label sets with
    nothing to say are left out. A miss of both max_gap and stall counts once each."""
    out: dict[Key, Why] = {}
    for name, labels, value in samples:
        if math.isnan(value) or value <= 0:  # nothing
            continue
        key = (labels.get(_OP, ""), labels.get(_MODEL, ""))
        for target in (key, ALL):
            _count(out.setdefault(target, Why()), name, labels, value)
    return {key: why for key, why in out.items() if not why.empty}


def shares(counts: Mapping[str, float], words: Mapping[str, str]) -> str:
    """``71 % queue, 22 % prefill``: each part's share, the largest first; ``-`` if none."""
    total = sum(counts.values())
    if total <= 0:
        return "-"
    order = list(words)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], order.index(kv[0])
                                                    if kv[0] in order else 99))  # fmt: skip
    return ", ".join(f"{value / total:.0%} {words.get(name, name)}" for name, value in ranked)


def render(rows: Mapping[Key, Why]) -> str:
    """The report for people: all label sets first, then each."""
    lines: list[str] = []
    for key in sorted(rows, key=lambda k: (k != ALL, k)):
        why = rows[key]
        title = "all requests" if key == ALL else f"{key[0]} {key[1]}"
        lines.append(f"{title}:")
        for label, counts, words in (
            ("TTFT misses", why.ttft_misses, PHASE_WORDS),
            ("gap and stall misses", why.gap_misses, STALL_WORDS),
            ("stalls", why.stalls, STALL_WORDS),
            ("TTFT spent in", why.ttft_seconds, PHASE_WORDS),
        ):
            total = sum(counts.values())
            amount = f"{total:.3g} s" if counts is why.ttft_seconds else f"{total:.0f}"
            lines.append(f"  {label} ({amount}): {shares(counts, words)}")
    return "\n".join(lines)


def as_json(rows: Mapping[Key, Why], error: str = "") -> str:
    """The report for tools: the counts of each label set (``all`` first), or why none."""
    report: dict[str, Any] = {
        "label_sets": [
            {"operation": op, "model": model, **why.parts()}
            for (op, model), why in sorted(rows.items(), key=lambda kv: (kv[0] != ALL, kv[0]))
        ]
    }
    if error:
        report["error"] = error
    return json.dumps(report, indent=2)


# -- I/O: the sources of ``llmobs slo`` ---------------------------------------------------------

_FAMILIES = frozenset({SLO_MISSES.prometheus, STALLS.prometheus, _PHASE_SUM})


def read_sidecar(url: str, token: str = "") -> dict[Key, Why]:
    """A sidecar's counts since it started; ``CannotJudge`` when there are none."""
    text = fetch_metrics(url, token)
    try:
        samples = [(s.name, s.labels, float(s.value))
                   for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name in _FAMILIES]  # fmt: skip
    except ValueError:
        raise CannotJudge(f"{url} answered with something that is not metrics") from None
    rows = tally(samples)
    if not rows:
        raise CannotJudge(
            f"nothing slow counted yet at {url}: no stall, no missed objective, no first token"
        )
    return rows


def _queries(window: str) -> dict[str, str]:
    by = f"{_OP}, {_MODEL}"
    return {
        SLO_MISSES.prometheus: f"sum by ({by}, objective, cause) "
        f"(increase({SLO_MISSES.prometheus}[{window}]))",
        STALLS.prometheus: f"sum by ({by}, cause) (increase({STALLS.prometheus}[{window}]))",
        _PHASE_SUM: f"sum by ({by}, phase) (increase({_PHASE_SUM}[{window}]))",
    }


def read_prometheus(base: str, window: str, end: float | None = None) -> dict[Key, Why]:
    """Every sidecar's counts over ``window`` up to ``end``; ``CannotJudge`` when none."""
    vectors = query_prometheus(base, window, end, queries=_queries(window))
    rows = tally((name, labels, value) for name, found in vectors.items()
                 for labels, value in found)  # fmt: skip
    if not rows:
        raise CannotJudge(f"nothing slow counted at {base} over the last {window}")
    return rows


def run_why_cli(
    args: argparse.Namespace, out: Any, environ: Mapping[str, str] | None = None
) -> int:
    """Print the report; 0 with one, 2 when there is nothing to report from."""
    try:
        env = os.environ if environ is None else environ
        rows, source = read_source(args, env, read_sidecar, read_prometheus)
    except CannotJudge as exc:
        print(f"llmobs why: {exc}.", file=sys.stderr)
        if args.json:
            print(as_json({}, str(exc)), file=out)
        return 2
    if args.json:
        print(as_json(rows), file=out)
    else:
        print(f"why it was slow ({source}):", file=out)
        print(render(rows), file=out)
    return 0
