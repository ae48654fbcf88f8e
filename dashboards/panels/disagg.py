"""One request, two pods: disaggregated prefill and decode (docs/metrics.md). The users'
requests' TTFT phases (remote_prefill, kv_transfer, first_decode) are in the "Why it was slow"
row with the others; this row shows the legs, which no user-facing panel counts.
"""

from __future__ import annotations

from panels.builders import Json, target, timeseries
from panels.names import PD_JOINS, PD_LEG_DURATION, PD_LEG_PHASE, PD_REQUESTS
from panels.promql import POD, quantile, rate


def _leg_phases(role: str, title: str, description: str) -> Json:
    """A leg's mean time in its phases, stacked."""
    selector = f'{POD}, pd_role="{role}"'
    seconds = f"sum by (phase) ({rate(PD_LEG_PHASE + '_sum', selector)})"
    legs = f"sum ({rate(PD_LEG_DURATION + '_count', selector)})"
    return timeseries(title, description, [target(f"{seconds} / scalar({legs})", "{{phase}}")],
                      "s", stack=True, width=6)  # fmt: skip


def disagg_row() -> list[Json]:
    """Disaggregated requests by role, the legs' phases, the KV transfer, the joins."""
    transfer = f'{POD}, pd_role="decode_leg", phase="kv_transfer"'
    return [
        timeseries(
            "Disaggregated requests and their legs",
            "Per second, by role: users' requests whose prefill ran on another pod "
            "(disaggregated), and the legs the pods served for them (prefill_leg on prefill "
            "pods, decode_leg and local_leg behind the routing sidecar). Each decode pod's "
            "disaggregated rate is the prefill legs it asks of the prefill pods.",
            [target(f"sum by (pod, pd_role) ({rate(PD_REQUESTS, POD)})", "{{pod}} {{pd_role}}")],
            "reqps",
            width=6,
        ),
        _leg_phases(
            "prefill_leg",
            "Prefill legs in phases",
            "The mean prefill leg as the prefill pod served it: its queue and prefill where "
            "the engine reports them, the rest in other. A growing queue calls for more "
            "prefill pods.",
        ),
        _leg_phases(
            "decode_leg",
            "Decode legs to their first token",
            "The mean decode leg's wait for its first token: kv_transfer (the KV cache's "
            "transfer, then a place in the batch), first_decode (the first step). A growing "
            "kv_transfer calls for a faster interconnect or fewer legs per decode pod.",
        ),
        timeseries(
            "KV transfer and joins",
            "The decode engine's wait for the KV cache (P50, P99), and per second how this "
            "pod's users' requests met their decode legs: joined, no_decode_leg (the prefill "
            "failed, or the leg went past this sidecar), orphan_leg (a leg no request took).",
            [
                target(quantile(0.5, PD_LEG_PHASE, transfer), "kv_transfer p50"),
                target(quantile(0.99, PD_LEG_PHASE, transfer), "kv_transfer p99"),
                target(f"sum by (result) ({rate(PD_JOINS, POD)})", "{{result}} /s"),
            ],
            "s",
            width=6,
        ),
    ]
