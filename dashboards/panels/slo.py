"""The service-level objectives row: attainment, error budget and burn rate over the window
chosen on the dashboard, goodput, and which objective binds (docs/slo.md).
"""

from __future__ import annotations

from llmobs.config.objectives import DEFAULT_TARGET
from panels.builders import Json, stat, target, thresholds, timeseries
from panels.names import (
    REQUESTS,
    SLO_MISSES,
    SLO_REQUESTS,
    SLO_TARGET,
    SLO_TOKENS,
    SLO_WINDOW_SECONDS,
    TOKENS,
)
from panels.promql import MODEL, OUTPUT, SLO_BUDGET, SLO_WINDOW, bad_ratio, rate, total


def slo_row() -> list[Json]:
    """How the objectives hold: figures first, then their course over time."""
    good = MODEL + ', verdict="good"'
    overall = bad_ratio(SLO_WINDOW, by="")
    return [
        stat(
            "Attainment",
            "Share of judged requests of the models chosen that met their objectives, over the "
            "SLO window chosen above.",
            f"1 - ({overall})",
            "percentunit",
            thresholds((None, "red"), (DEFAULT_TARGET, "green")),
            decimals=3,
        ),
        stat(
            "Error budget left (worst model)",
            "The least error budget any model chosen has left over the SLO window.",
            f"min(1 - ({bad_ratio(SLO_WINDOW)}) / {SLO_BUDGET})",
            "percentunit",
            thresholds((None, "red"), (0, "orange"), (0.5, "green")),
        ),
        stat(
            "Burn rate 1h (worst model)",
            "The fastest any model chosen spends its error budget, over the last hour: 1 "
            "spends it in exactly its window; the page alert needs 14.4.",
            f"max(({bad_ratio('1h')}) / {SLO_BUDGET})",
            "none",
            thresholds((None, "green"), (1, "orange"), (14.4, "red")),
            decimals=2,
        ),
        stat(
            "Goodput",
            "Requests per second that met their objectives.",
            total(SLO_REQUESTS, good),
            "reqps",
            thresholds((None, "blue")),
        ),
        stat(
            "Target",
            "The strictest target of the models chosen (--slo-target, --slo-file).",
            f"max({SLO_TARGET}{{{MODEL}}})",
            "percentunit",
            thresholds((None, "blue")),
            decimals=3,
        ),
        stat(
            "Objective window",
            "The window the sidecars measure their targets over (--slo-window); the panels "
            "here use the SLO window chosen above.",
            f"max({SLO_WINDOW_SECONDS}{{{MODEL}}})",
            "s",
            thresholds((None, "blue")),
        ),
        timeseries(
            "Attainment over the SLO window",
            "Share of judged requests that met every bound of their objective set (docs/slo.md), "
            "per model, over the window chosen above (client disconnects and 4xx are not "
            "judged). The dashed line is each model's target.",
            [
                target(f"1 - ({bad_ratio(SLO_WINDOW)})", "{{gen_ai_request_model}}"),
                target(
                    f"max by (gen_ai_request_model) ({SLO_TARGET}{{{MODEL}}})",
                    "target {{gen_ai_request_model}}",
                ),
            ],
            "percentunit",
            max=1,
        ),
        timeseries(
            "Error budget remaining",
            "1 − (bad share over the window) / (1 − target): 100 % untouched, 0 spent, below "
            "0 overspent.",
            [
                target(
                    f"1 - ({bad_ratio(SLO_WINDOW)}) / {SLO_BUDGET}",
                    "{{gen_ai_request_model}}",
                )
            ],
            "percentunit",
            thresholds=thresholds((None, "red"), (0, "transparent")),
        ),
        timeseries(
            "Burn rate",
            "Bad share / (1 − target) over 1 h and 6 h: 1 spends the budget in exactly the "
            "window; the page alert needs 14.4 (1 h) or 6 (6 h), the ticket 3 (1 d) or 1 (3 d).",
            [
                target(f"({bad_ratio('1h')}) / {SLO_BUDGET}", "1h {{gen_ai_request_model}}"),
                target(f"({bad_ratio('6h')}) / {SLO_BUDGET}", "6h {{gen_ai_request_model}}"),
            ],
            "none",
            min=0,
            thresholds=thresholds((None, "transparent"), (6, "orange"), (14.4, "red")),
        ),
        timeseries(
            "Goodput and throughput (requests/s)",
            "Requests per second that met their objectives, next to all judged requests and all "
            "requests relayed.",
            [
                target(total(SLO_REQUESTS, good), "good"),
                target(total(SLO_REQUESTS), "judged"),
                target(total(REQUESTS), "all"),
            ],
            "reqps",
        ),
        timeseries(
            "Token goodput and throughput (tokens/s)",
            "Output tokens per second of requests that met their objectives, next to all output "
            "tokens.",
            [
                target(total(SLO_TOKENS, good), "good"),
                target(total(TOKENS, MODEL + ", gen_ai_token_type=" + OUTPUT), "all"),
            ],
            "short",
        ),
        timeseries(
            "Misses by objective (the binding one)",
            "Bad requests per second by the objective they missed; one request may miss "
            "several. The tallest is the constraint that binds.",
            [target(f"sum by (objective) ({rate(SLO_MISSES)}) > 0", "{{objective}}")],
            "reqps",
        ),
    ]
