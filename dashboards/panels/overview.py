"""The overview row: the figures to glance at first (TTFT and ITL P99, smoothness, stalls,
throughput, engine failures, each red past its alert default), and the worst pods of a fleet.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import table as table_builders
from grafana_foundation_sdk.models import dashboard as dashboard_models

from panels.builders import Json, built, panel, stat, target, thresholds
from panels.names import (
    FAILURE_RATIO_MAX,
    ITL,
    ITL_SLO,
    REQUESTS,
    SLO_TARGET,
    SMOOTHNESS_MIN,
    STALLS,
    STALLS_PER_1K_MAX,
    TTFT,
    TTFT_SLO,
)
from panels.promql import (
    FAILURE_RATIO,
    MODEL,
    SLO_WINDOW,
    SMOOTH_TOKENS,
    STALLS_PER_1K,
    bad_ratio,
    native_total,
    quantile,
    rate,
    total,
)


def overview_row() -> list[Json]:
    """The figures to read first, each against its alert default."""
    return [
        stat(
            "TTFT P99",
            f"99th percentile time to first token. Red above the {TTFT_SLO:g} s alert default.",
            quantile(0.99, TTFT),
            "s",
            thresholds((None, "green"), (TTFT_SLO, "red")),
        ),
        stat(
            "ITL P99",
            f"99th percentile gap before a token. Red above the {ITL_SLO * 1000:g} ms default.",
            quantile(0.99, ITL),
            "s",
            thresholds((None, "green"), (ITL_SLO, "red")),
        ),
        stat(
            "Smoothness",
            "Token-weighted 1/(1+CV²) of all ITLs: 1 = perfectly steady. "
            f"Red below the {SMOOTHNESS_MIN:g} alert default.",
            SMOOTH_TOKENS,
            "none",
            thresholds((None, "red"), (SMOOTHNESS_MIN, "green")),
            min=0,
            max=1,
            decimals=3,
        ),
        stat(
            "Stalls / 1000 tokens",
            f"Visible pauses per 1000 output tokens. Red above the {STALLS_PER_1K_MAX:g} default.",
            STALLS_PER_1K,
            "none",
            thresholds((None, "green"), (STALLS_PER_1K_MAX, "red")),
            decimals=1,
        ),
        stat(
            "Requests/s",
            "Requests relayed per second, all outcomes.",
            total(REQUESTS),
            "reqps",
            thresholds((None, "blue")),
        ),
        stat(
            "Engine failures",
            "Share of requests the engine refused, reset, answered with 5xx or let time out. "
            f"Red above the {FAILURE_RATIO_MAX:.0%} alert default.",
            FAILURE_RATIO,
            "percentunit",
            thresholds((None, "green"), (FAILURE_RATIO_MAX, "red")),
        ),
    ]


# The worst pods: each pod's TTFT P99, stalls per 1000 tokens, and error budget left over the
# SLO window, joined by namespace and pod (a fleet's question: which pod to look at first; a
# pod's name may repeat in another namespace)
_POD = "namespace, pod"
_BY_POD_TTFT = quantile(0.99, TTFT, by=_POD)
_BY_POD_TOKENS = native_total("count", ITL, by=_POD)
_BY_POD_STALLS = (
    f"1000 * (sum by ({_POD}) ({rate(STALLS)}) or 0 * {_BY_POD_TOKENS}) / ({_BY_POD_TOKENS} > 0)"
)
_BY_POD_BUDGET = (
    f"1 - ({bad_ratio(SLO_WINDOW, by=_POD)}) / (1 - max by ({_POD}) ({SLO_TARGET}{{{MODEL}}}))"
)
WORST_PODS = {"TTFT P99": _BY_POD_TTFT, "Stalls / 1k tokens": _BY_POD_STALLS,
              "Budget left": _BY_POD_BUDGET}  # fmt: skip


def worst_pods() -> Json:
    """A table of pods, worst TTFT first, with their stall rate and error budget left."""
    units = {"TTFT P99": "s", "Stalls / 1k tokens": "none", "Budget left": "percentunit"}
    names = {f"Value #{ref}": title for ref, title in zip("ABC", WORST_PODS, strict=True)}
    b = panel(
        table_builders.Panel(), "Worst pods",
        "Each pod's TTFT P99 and stalls per 1000 tokens over the last minutes, and its error "
        "budget left over the SLO window (its own requests against its target), worst TTFT "
        "first: which pod to open. The fleet's answers are the panels around it.",
        [target(expr, title, fmt="table").instant() for title, expr in WORST_PODS.items()],
        "short", 24, 8,
    )  # fmt: skip
    b = b.with_transformation(dashboard_models.DataTransformerConfig(id_val="merge", options={}))
    b = b.with_transformation(dashboard_models.DataTransformerConfig(
        id_val="organize", options={"excludeByName": {"Time": True}, "renameByName": names},
    ))  # fmt: skip
    for title, unit in units.items():
        b = b.override_by_name(title, [dashboard_models.DynamicConfigValue("unit", unit)])
    b = b.sort_by([common_builders.TableSortByFieldState().display_name("TTFT P99").desc(True)])
    return built(b)
