"""Saturation: what an autoscaler reads (docs/metrics.md, "Saturation"). Per pod, as the
recording rules make it (deploy/prometheus/rules.yml, ``llmobs.saturation``): its requests'
latency against their objective (the 90th percentile), and its prompts waiting in seconds of
the engine's measured pace over its tightest TTFT bound; 1 is at the objective.
"""

from __future__ import annotations

from panels.builders import Json, target, timeseries
from panels.names import (
    ACTIVE,
    PREFILL_BACKLOG,
    PREFILL_BACKLOG_REQUESTS,
    PREFILL_BACKLOG_TOKENS,
    PREFILL_BUSY,
    SLO_BOUND,
    SLO_LATENCY_RATIO,
)
from panels.promql import POD, quantile, rate


def knee_seen() -> Json:
    """Each pod's load against the knee its own traffic showed (the rules' ``llmobs.knee``,
    here from the raw series: the dashboard needs no recording rule)."""
    load = f"sum by (pod) (avg_over_time({ACTIVE}{{{POD}}}[1m]))"
    latency = f"({quantile(0.9, SLO_LATENCY_RATIO, POD, by='pod')})"
    # a point every 15 s (the rules' every minute): a new pod's first reading within 15 s
    held = f"max_over_time(({load} and on (pod) {latency} <= 1)[6h:15s])"
    broke = f"min_over_time(({load} and on (pod) {latency} > 1)[6h:15s])"
    return timeseries(
        "Load against the knee seen",
        "Requests in flight per pod (a minute's average) against the knee its own traffic "
        "showed over the last 6 hours: the highest load at which its requests' latency held "
        "within their bounds (p90), and the lowest at which it broke. Near the lower line the "
        "pod is at its knee. Valid while the mix of prompts stays the same and the load has "
        "reached the knee in the window (docs/measure-first.md); a break below a load that "
        "held means something else broke it.",
        [
            target(load, "{{pod}} in flight"),
            target(
                f'label_replace({held}, "seen", "held up to", "", "") or '
                f'label_replace({broke}, "seen", "broke from", "", "")',
                "{{pod}} {{seen}}",
            ),
        ],
        "short",
        width=12,
    )


def saturation_row() -> list[Json]:
    """Each pod's saturation in its two parts, its backlog, its busy share."""
    backlog = (
        f"max by (pod) ({PREFILL_BACKLOG}{{{POD}}}) / on (pod) "
        f'min by (pod) ({SLO_BOUND}{{{POD}, objective="ttft"}})'
    )
    return [
        timeseries(
            "Saturation by pod",
            "How close what users feel is to its objective, per pod (1: at it): the 90th "
            "percentile of its requests' latency against their own bounds (TTFT or TPOT, the "
            "nearer), and its prompts waiting, in seconds of the engine's pace, over its "
            "tightest TTFT bound (the wait the next request starts with). An autoscaler "
            "reads the larger, averaged over the pods.",
            [
                target(quantile(0.9, SLO_LATENCY_RATIO, POD, by="pod"), "{{pod}} latency p90"),
                target(backlog, "{{pod}} backlog"),
            ],
            "short",
            width=6,
        ),
        timeseries(
            "Prefill backlog",
            "Seconds of prefill the prompts waiting for their first token will take at the "
            "pace the engine has shown (fitted to its services, no throughput set by hand), "
            "per pod and P/D role. Absent on a cold start until the engine answered a first "
            "prompt.",
            [target(f"sum by (pod, pd_role) ({PREFILL_BACKLOG}{{{POD}}})", "{{pod}} {{pd_role}}")],
            "s",
            width=6,
        ),
        timeseries(
            "Prompts waiting",
            "Requests waiting for their first token (a prefill leg: its answer), and their "
            "prompts' tokens as estimated from their bytes, per pod and role.",
            [
                target(
                    f"sum by (pod, pd_role) ({PREFILL_BACKLOG_REQUESTS}{{{POD}}})",
                    "{{pod}} {{pd_role}} requests",
                ),
                target(
                    f"sum by (pod, pd_role) ({PREFILL_BACKLOG_TOKENS}{{{POD}}})",
                    "{{pod}} {{pd_role}} tokens",
                ),
            ],
            "short",
            width=6,
        ),
        timeseries(
            "Prefill behind",
            "The share of time a prompt was waiting for its first token, per pod and role: "
            "near 1 the engine's prefill never catches up.",
            [target(f"sum by (pod, pd_role) ({rate(PREFILL_BUSY, POD)})", "{{pod}} {{pd_role}}")],
            "percentunit",
            width=6,
        ),
        knee_seen(),
    ]
