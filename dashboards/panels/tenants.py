"""Who it was slow for and what it cost: requests, TTFT, attainment and cost by tenant, and
the traffic of LoRA adapters by base model.
"""

from __future__ import annotations

from panels.builders import Json, target, timeseries
from panels.names import COST, MODEL_INFO, REQUESTS, SLO_REQUESTS, TTFT
from panels.promql import MODEL, quantile, rate


def tenants_row() -> list[Json]:
    """Who it was slow for and what it cost (docs/metrics.md, Tenants and Cost): empty until
    the sidecar labels tenants (--tenant-header, --tenant-keys) or prices tokens (--price-file)."""
    bad_selector = MODEL + ', verdict="bad"'
    bad = f"sum by (tenant) ({rate(SLO_REQUESTS, bad_selector)})"
    judged = f"sum by (tenant) ({rate(SLO_REQUESTS)})"
    ttft = quantile(0.99, TTFT, by="tenant")
    return [
        timeseries(
            "Requests by tenant",
            "Requests per second by tenant: the key file's names, the tenant header's values "
            "(bounded: other past --max-tenants), unknown when a request names none.",
            [target(f"sum by (tenant) ({rate(REQUESTS)})", "{{tenant}}")],
            "reqps",
            stack=True,
            width=6,
        ),
        timeseries(
            "P99 TTFT by tenant",
            "Who waits for the first token: a tenant whose P99 rises alone sends longer prompts "
            "or more at once; all together, the deployment is short of capacity.",
            [target(ttft, "{{tenant}}")],
            "s",
            width=6,
        ),
        timeseries(
            "SLO: share of good requests by tenant",
            "Each tenant against its own objective (--slo-file entries naming the tenant).",
            [target(f"1 - {bad} / {judged}", "{{tenant}}")],
            "percentunit",
            width=6,
            max=1,
        ),
        timeseries(
            "Cost per hour by model and tenant",
            "What the tokens cost at the price file's prices, per hour, and what the bad "
            "requests' tokens cost (failed or slow past their objective).",
            [
                target(
                    f"3600 * sum by (gen_ai_request_model, tenant, currency) ({rate(COST)})",
                    "{{gen_ai_request_model}} {{tenant}} ({{currency}})",
                ),
                target(
                    f"3600 * sum by (currency) ({rate(COST, bad_selector)})",
                    "bad requests ({{currency}})",
                ),
            ],
            "short",
            width=6,
        ),
        timeseries(
            "Requests by base model (LoRA adapters)",
            "Requests per second to each LoRA adapter, summed by the base model the engine's "
            "/v1/models names for it (llmobs_model_info): how much of a base model's traffic "
            "its adapters carry.",
            [
                target(
                    f"sum by (base_model) ({rate(REQUESTS)} * on (gen_ai_request_model) "
                    f"group_left (base_model) max by (gen_ai_request_model, base_model) "
                    f"({MODEL_INFO}))",
                    "{{base_model}}",
                )
            ],
            "reqps",
            stack=True,
            width=24,
        ),
    ]
