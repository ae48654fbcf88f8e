"""Both reports for people (tables, shares in words) and for tools (JSON), pure: ``llmobs
slo``'s attainment per label set and where its misses are, ``llmobs why``'s causes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llmobs.config.objectives import Objective
from llmobs.observe.phases import Phase
from llmobs.tools.amounts import amount
from llmobs.tools.slo.attainment import Breakdown, Key, Row, outcome, passed
from llmobs.tools.slo.reasons import ALL, Why
from llmobs.tools.slo.reasons import Key as WhyKey

# the words a person reads for each cause, in the order they are listed when tied
PHASE_WORDS = {
    Phase.BEFORE_ENGINE.value: "before the engine", Phase.LOAD.value: "model load",
    Phase.QUEUE.value: "queue", Phase.PREFILL.value: "prefill", Phase.OTHER.value: "other",
    Phase.REMOTE_PREFILL.value: "remote prefill (another pod)",
    Phase.KV_TRANSFER.value: "KV transfer and the decode engine's wait",
    Phase.FIRST_DECODE.value: "first decode step", "none": "no phase known",
}  # fmt: skip
STALL_WORDS = {
    "prefill": "prefill interference", "preemption": "preemptions",
    "engine_pause": "engine pauses", "client": "client", "unknown": "unknown",
    "none": "no stall",
}  # fmt: skip


def _table(lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]  # fmt: skip
    return "\n".join(text)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3%}"


def _misses(row: Row) -> str:
    order = [o.value for o in Objective]
    return ", ".join(
        f"{name} {row.misses[name]:.0f}"
        for name in sorted(row.misses, key=lambda n: order.index(n) if n in order else 99)
        if row.misses[name] > 0
    )


def _cost(row: Row) -> str:
    """``0.00009 (0.00003) EUR``: the cost and the bad requests' share of it, with the
    figures they need (``tools.amounts``) and the currency."""
    return f"{amount(row.cost or 0.0)} ({amount(row.bad_cost)}) {row.currency}".rstrip()


def slo_table(rows: Mapping[Key, Row], target: float | None = None) -> str:
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
        cost = _cost(row) if row.cost is not None else "-"
        lines.append((
            op, model, *((tenant,) if tenants else ()), f"{row.judged:.0f}", f"{row.good:.0f}",
            _pct(row.attainment), _pct(goal), "yes" if row.met(target) else "NO", tokens,
            *((cost,) if priced else ()), _misses(row) or "-",
        ))  # fmt: skip
    return _table(lines)


def breakdown_table(rows: Breakdown, by: str) -> str:
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


def slo_json(
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
            **({"cost": row.cost, "bad_cost": row.bad_cost, "currency": row.currency}
               if row.cost is not None else {}),
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


def shares(counts: Mapping[str, float], words: Mapping[str, str]) -> str:
    """``71 % queue, 22 % prefill``: each part's share, the largest first; ``-`` if none."""
    total = sum(counts.values())
    if total <= 0:
        return "-"
    order = list(words)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], order.index(kv[0])
                                                    if kv[0] in order else 99))  # fmt: skip
    return ", ".join(f"{_share(value / total)} {words.get(name, name)}" for name, value in ranked)


def _share(part: float) -> str:
    """A share in whole percent; one that would round to 0 % reads ``<1%``: something, not
    nothing."""
    shown = f"{part:.0%}"
    return "<1%" if shown == "0%" else shown


def _all_first(key: WhyKey) -> tuple[bool, WhyKey]:
    return key != ALL, key


def why_text(rows: Mapping[WhyKey, Why]) -> str:
    """The report for people: all label sets first, then each."""
    lines: list[str] = []
    for key in sorted(rows, key=_all_first):
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


def why_json(rows: Mapping[WhyKey, Why], error: str = "") -> str:
    """The report for tools: the counts of each label set (``all`` first), or why none."""
    report: dict[str, Any] = {
        "label_sets": [
            {"operation": op, "model": model, **why.parts()}
            for (op, model), why in sorted(rows.items(), key=lambda kv: _all_first(kv[0]))
        ]
    }
    if error:
        report["error"] = error
    return json.dumps(report, indent=2)
