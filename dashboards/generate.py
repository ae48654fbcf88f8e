"""Builds dashboards/llmobs.json, the main Grafana dashboard, from the rows defined below.

Dashboards as code: edit this file, run ``python dashboards/generate.py``, commit both.
``--check`` exits 1 when the committed JSON is not what this script builds (CI runs it through
tests/deploy/test_dashboards.py). Every query uses only metrics of the catalogue
(``llmobs/export/metrics/catalogue.py``), by the names it gives them, and every metric of the
catalogue is on a panel (the test checks both); template variables:
datasource, namespace, job, pod, model (the first three pick pods, "All" by default: one
pod, one job's, or the fleet, summed as Prometheus sums them).

Panels, queries, variables and the dashboard itself are built with Grafana's
grafana-foundation-sdk (typed builders generated from Grafana 11.2's schema, a test
dependency): a misspelt option or a wrong enum value fails here, not in Grafana. Two things
of an export stay outside it: the ``__requires`` header and a query variable's
``definition``.

The engine's queue and KV cache come from the sidecar's engine collector, under uniform names
with an ``engine`` label, whatever the engine; the GPU row from its NVML collector, with MBU
next to the bandwidth NVML measures (docs/gpu.md says how the two differ).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import heatmap as heatmap_builders
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.builders import stat as stat_builders
from grafana_foundation_sdk.builders import table as table_builders
from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models import heatmap as heatmap_models
from grafana_foundation_sdk.models import prometheus as prometheus_models

from llmobs.config.objectives import DEFAULT_TARGET
from llmobs.export.metrics import catalogue as c
from llmobs.export.metrics import thresholds as t

OUT = Path(__file__).resolve().with_name("llmobs.json")

Json = dict[str, Any]

DS: Json = {"type": "prometheus", "uid": "${datasource}"}
DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")
POD = 'namespace=~"$namespace", job=~"$job", pod=~"$pod"'
MODEL = POD + ', gen_ai_request_model=~"$model"'
RATE_INTERVAL = "$__rate_interval"

# Every name from the catalogue (llmobs/export/metrics/catalogue.py), every threshold from the
# alert rules' defaults (llmobs/export/metrics/thresholds.py): a rename or a new default cannot
# leave a panel behind.
TTFT = c.TTFT.prometheus
TTFT_PHASE = c.TTFT_PHASE.prometheus
TPOT = c.TPOT.prometheus
DURATION = c.DURATION.prometheus
USAGE = c.TOKEN_USAGE.prometheus
# the newest GenAI conventions' per-direction histograms (OTEL_SEMCONV_STABILITY_OPT_IN)
USAGE_BY_DIRECTION = {"input": c.INPUT_TOKENS.prometheus, "output": c.OUTPUT_TOKENS.prometheus}
TOKENS = c.TOKENS.prometheus
ENGINE_PROMPT_EVAL = c.ENGINE_PROMPT_EVAL.prometheus
ENGINE_LOAD = c.ENGINE_LOAD.prometheus
ITL = c.ITL.prometheus
ITL_SQUARES = c.ITL_SQUARES.prometheus
STALLS = c.STALLS.prometheus
SMOOTHNESS = c.SMOOTHNESS.prometheus
REQUESTS = c.REQUESTS.prometheus
ACTIVE = c.ACTIVE.prometheus
QUEUE = c.QUEUE_DEPTH.prometheus
MALFORMED = c.MALFORMED.prometheus
OBSERVER_ERRORS = c.OBSERVER_ERRORS.prometheus
SPANS_DROPPED = c.SPANS_DROPPED.prometheus
COLLECTOR_UP = c.COLLECTOR_UP.prometheus
PROCESS_CPU = c.PROCESS_CPU.prometheus
PROCESS_RSS = c.PROCESS_RSS.prometheus
PROCESS_VMS = c.PROCESS_VMS.prometheus
PROCESS_FDS = c.PROCESS_FDS.prometheus
PROCESS_MAX_FDS = c.PROCESS_MAX_FDS.prometheus
PROCESS_START = c.PROCESS_START.prometheus
PYTHON_INFO = c.PYTHON_INFO.prometheus
GC_COLLECTIONS = c.GC_COLLECTIONS.prometheus
GC_COLLECTED = c.GC_COLLECTED.prometheus
GC_UNCOLLECTABLE = c.GC_UNCOLLECTABLE.prometheus
BUILD_INFO = c.BUILD_INFO.prometheus
COLLECTOR_DURATION = c.COLLECTOR_DURATION.prometheus
COLLECTOR_ERRORS = c.COLLECTOR_ERRORS.prometheus
ENGINE_WAITING = c.ENGINE_WAITING.prometheus
ENGINE_RUNNING = c.ENGINE_RUNNING.prometheus
ENGINE_KV_CACHE = c.ENGINE_KV_CACHE.prometheus
PREFIX_HITS = c.ENGINE_PREFIX_HITS.prometheus
PREFIX_QUERIES = c.ENGINE_PREFIX_QUERIES.prometheus
PREFIX_RATIO = c.ENGINE_PREFIX_RATIO.prometheus
SPEC_ACCEPTED = c.ENGINE_SPEC_ACCEPTED.prometheus
SPEC_DRAFTED = c.ENGINE_SPEC_DRAFTED.prometheus
PREEMPTIONS = c.ENGINE_PREEMPTIONS.prometheus
GPU_MEMORY = {
    "used": c.GPU_MEMORY_USED.prometheus,
    "free": c.GPU_MEMORY_FREE.prometheus,
    "total": c.GPU_MEMORY_TOTAL.prometheus,
    "reserved": c.GPU_MEMORY_RESERVED.prometheus,
}
GPU_UTILIZATION = c.GPU_UTILIZATION.prometheus
GPU_MEMORY_CONTROLLER = c.GPU_MEMORY_CONTROLLER.prometheus
GPU_BANDWIDTH_UTILIZATION = c.GPU_BANDWIDTH_UTILIZATION.prometheus
GPU_BANDWIDTH = c.GPU_BANDWIDTH.prometheus
GPU_BANDWIDTH_PEAK = c.GPU_BANDWIDTH_PEAK.prometheus
GPU_POWER = c.GPU_POWER.prometheus
GPU_TEMPERATURE = c.GPU_TEMPERATURE.prometheus
GPU_CLOCK = {"sm": c.GPU_CLOCK_SM.prometheus, "memory": c.GPU_CLOCK_MEMORY.prometheus}
SLO_REQUESTS = c.SLO_REQUESTS.prometheus
COST = c.COST.prometheus
MODEL_INFO = c.MODEL_INFO.prometheus
SLO_MISSES = c.SLO_MISSES.prometheus
SLO_TOKENS = c.SLO_OUTPUT_TOKENS.prometheus
SLO_TARGET = c.SLO_TARGET.prometheus
SLO_WINDOW_SECONDS = c.SLO_WINDOW.prometheus
SLO_WINDOW = "$slo_window"  # a range chosen on the dashboard (default 28d: --slo-window's)
MBU = c.MBU.prometheus
MFU = c.MFU.prometheus
FAILED = 'outcome=~"upstream_error|upstream_timeout"'

# Alert defaults (deploy/prometheus/alerts.yml), drawn as thresholds.
TTFT_SLO = t.TTFT_P99_S
ITL_SLO = t.ITL_P99_S
SMOOTHNESS_MIN = t.SMOOTHNESS_MIN
STALLS_PER_1K_MAX = t.STALLS_PER_1K_MAX
FAILURE_RATIO_MAX = t.FAILURE_RATIO_MAX
KV_CACHE_MAX = t.KV_CACHE_MAX
GPU_MEMORY_MAX = t.GPU_MEMORY_MAX


# the histograms the sidecar also exposes as native ones
NATIVE = frozenset(m.prometheus for m in c.CATALOGUE if m.native is not None)


def rate(metric: str, selector: str = MODEL, fn: str = "rate") -> str:
    return f"{fn}({metric}{{{selector}}}[{RATE_INTERVAL}])"


def quantile(q: float, histogram: str, selector: str = MODEL, by: str = "") -> str:
    """From the native histogram where Prometheus has one (a few percent from the exact
    quantile), else from the classic buckets (docs/metrics.md); per ``by`` labels if any."""
    classic_by = f"le, {by}" if by else "le"
    classic = (
        f"histogram_quantile({q}, sum by ({classic_by}) ({rate(histogram + '_bucket', selector)}))"
    )
    if histogram not in NATIVE:
        return classic
    group = f"sum by ({by}) " if by else "sum"
    return f"histogram_quantile({q}, {group}({rate(histogram, selector)})) or {classic}"


def total(metric: str, selector: str = MODEL) -> str:
    return f"sum({rate(metric, selector)})"


def native_total(part: str, histogram: str, selector: str = MODEL, by: str = "") -> str:
    """The rate of a histogram's count or sum (``part``), from the native histogram where
    Prometheus keeps only that (2.40-2.44), else from the classic series; per ``by``."""
    group = f"sum by ({by}) " if by else "sum"
    native = f"{group}(histogram_{part}({rate(histogram, selector)}))"
    return f"({native} or {group}({rate(f'{histogram}_{part}', selector)}))"


ITL_COUNT = native_total("count", ITL)
ITL_SUM = native_total("sum", ITL)
ITL_MEAN = f"{ITL_SUM} / {ITL_COUNT}"
ITL_STDDEV = f"sqrt(clamp_min({total(ITL_SQUARES)} / {ITL_COUNT} - ({ITL_MEAN}) ^ 2, 0))"
SMOOTH_TOKENS = f"{ITL_SUM} ^ 2 / ({ITL_COUNT} * {total(ITL_SQUARES)})"
STALLS_PER_1K = f"1000 * ({total(STALLS)} or vector(0)) / {ITL_COUNT}"
FAILURE_RATIO = f"({total(REQUESTS, MODEL + ', ' + FAILED)} or vector(0)) / {total(REQUESTS)}"
OK_REQUESTS = MODEL + ', outcome="ok"'
OUTPUT = '"output"'
STALLS_PER_REQUEST = f"({total(STALLS)} or vector(0)) / {total(REQUESTS, OK_REQUESTS)}"


def built(builder: Any) -> Json:
    """A builder's object as the JSON Grafana reads (the SDK's encoder)."""
    out: Json = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return out


def target(
    expr: str, legend: str = "__auto", *, exemplar: bool = False, fmt: str | None = None
) -> Any:
    """A Prometheus query (a builder: ``panel`` gives it its refId)."""
    query = prometheus.Dataquery().expr(expr).legend_format(legend).range()
    query = query.datasource(DATASOURCE)
    if exemplar:
        query = query.exemplar(True)
    if fmt is not None:
        query = query.format(prometheus_models.PromQueryFormat(fmt))
    return query


def thresholds(*steps: tuple[float | None, str]) -> Any:
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_models.Threshold(value=v, color=c) for v, c in steps])
    )


def panel(
    builder: Any,
    title: str,
    description: str,
    targets: Sequence[Any],
    unit: str = "short",
    width: int = 8,
    height: int = 8,
    **defaults: Any,
) -> Any:
    """The settings every panel has: title, description, data source, queries (refIds A, B,
    ...), unit, size, and the field defaults given (``min``, ``max``, ``decimals``,
    ``thresholds``)."""
    b = builder.title(title).description(description).datasource(DATASOURCE)
    b = b.unit(unit).span(width).height(height)
    for i, query in enumerate(targets):
        b = b.with_target(query.ref_id("ABCDEFGH"[i]))
    for name, value in defaults.items():
        b = getattr(b, name)(value)
    return b


def timeseries(
    title: str,
    description: str,
    targets: Sequence[Any],
    unit: str = "short",
    stack: bool = False,
    width: int = 8,
    **defaults: Any,
) -> Json:
    b = panel(timeseries_builders.Panel(), title, description, targets, unit, width, **defaults)
    stacking = (
        common_builders.StackingConfig()
        .group("A")
        .mode(common_models.StackingMode.NORMAL if stack else common_models.StackingMode.NONE)
    )
    line = common_models.GraphThresholdsStyleMode
    b = (
        b.draw_style(common_models.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(20 if stack else 0)
        .show_points(common_models.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(stacking)
        .thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(
                line.LINE if "thresholds" in defaults else line.OFF
            )
        )
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common_models.LegendDisplayMode.LIST)
            .placement(common_models.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common_models.TooltipDisplayMode.MULTI)
            .sort(common_models.SortOrder.DESCENDING)
        )
    )
    return built(b)


def stat(title: str, description: str, expr: str, unit: str, steps: Any, **defaults: Any) -> Json:
    b = panel(stat_builders.Panel(), title, description, [target(expr, title)], unit, 4, 4,
              **defaults)  # fmt: skip
    b = (
        b.thresholds(steps)
        .reduce_options(
            common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
        )
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .graph_mode(common_models.BigValueGraphMode.AREA)
        .text_mode(common_models.BigValueTextMode.VALUE)
        .justify_mode(common_models.BigValueJustifyMode.AUTO)
        .orientation(common_models.VizOrientation.AUTO)
    )
    return built(b)


def heatmap(title: str, description: str, histogram: str) -> Json:
    expr = f"sum by (le) ({rate(histogram + '_bucket', fn='increase')})"
    heat = target(expr, "{{le}}", fmt="heatmap", exemplar=True)  # exemplars: traces
    b = panel(heatmap_builders.Panel(), title, description, [heat], "s", 12)
    b = (
        b.calculate(False)
        .cell_gap(1)
        .color(
            heatmap_builders.HeatmapColorOptions()
            .mode(heatmap_models.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
            .exponent(0.5)
        )
        .y_axis(
            heatmap_builders.YAxisConfig()
            .axis_placement(common_models.AxisPlacement.LEFT)
            .unit("s")
        )
        .rows_frame(
            heatmap_builders.RowsHeatmapOptions().layout(common_models.HeatmapCellLayout.AUTO)
        )
        .mode(common_models.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_color_scale(True)
        .show_legend()
        .filter_values(heatmap_builders.FilterValueRange().le(1e-9))
        .exemplars_color("rgba(255,0,255,0.7)")
    )
    return built(b)


def overview_row() -> list[Json]:
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


def _bad_ratio(window: str, by: str = "gen_ai_request_model") -> str:
    """The share of judged requests that were bad over ``window``, per ``by`` (""; all)."""
    group = f"sum by ({by}) " if by else "sum "
    bad = f'{group}(increase({SLO_REQUESTS}{{{MODEL}, verdict="bad"}}[{window}]))'
    judged = f"{group}(increase({SLO_REQUESTS}{{{MODEL}}}[{window}]))"
    return f"{bad} / ({judged} > 0)"  # a model with none judged has no share, not 0/0


SLO_BUDGET = f"(1 - max by (gen_ai_request_model) ({SLO_TARGET}{{{MODEL}}}))"


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
    f"1 - ({_bad_ratio(SLO_WINDOW, by=_POD)}) / (1 - max by ({_POD}) ({SLO_TARGET}{{{MODEL}}}))"
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


def slo_row() -> list[Json]:
    good = MODEL + ', verdict="good"'
    overall = _bad_ratio(SLO_WINDOW, by="")
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
            f"min(1 - ({_bad_ratio(SLO_WINDOW)}) / {SLO_BUDGET})",
            "percentunit",
            thresholds((None, "red"), (0, "orange"), (0.5, "green")),
        ),
        stat(
            "Burn rate 1h (worst model)",
            "The fastest any model chosen spends its error budget, over the last hour: 1 "
            "spends it in exactly its window; the page alert needs 14.4.",
            f"max(({_bad_ratio('1h')}) / {SLO_BUDGET})",
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
                target(f"1 - ({_bad_ratio(SLO_WINDOW)})", "{{gen_ai_request_model}}"),
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
                    f"1 - ({_bad_ratio(SLO_WINDOW)}) / {SLO_BUDGET}",
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
                target(f"({_bad_ratio('1h')}) / {SLO_BUDGET}", "1h {{gen_ai_request_model}}"),
                target(f"({_bad_ratio('6h')}) / {SLO_BUDGET}", "6h {{gen_ai_request_model}}"),
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


def experience_row() -> list[Json]:
    def quantiles(histogram: str, qs: Iterable[float]) -> list[Json]:
        # exemplars on the highest quantile's query: a dot per bucket's latest traced request,
        # which links to its trace (docs/tracing.md)
        qs = list(qs)
        return [
            target(
                quantile(q, histogram),
                f"p{q * 100:g}",
                exemplar=q == qs[-1],
            )
            for q in qs
        ]

    ttft_slo = thresholds((None, "transparent"), (TTFT_SLO, "red"))
    itl_slo = thresholds((None, "transparent"), (ITL_SLO, "red"))
    return [
        timeseries(
            "Time to first token",
            "Queueing + prefill as the user waits for it, from the request reaching the sidecar "
            "to the first output token relayed.",
            quantiles(TTFT, (0.5, 0.95, 0.99)),
            "s",
            thresholds=ttft_slo,
        ),
        timeseries(
            "Inter-token latency",
            "Gap before each output token (a chunk's gap shared among its tokens).",
            [*quantiles(ITL, (0.5, 0.99)), target(ITL_MEAN, "mean")],
            "s",
            thresholds=itl_slo,
        ),
        timeseries(
            "Time per output token",
            "Per request: (last token time - first token time) / (output tokens - 1).",
            quantiles(TPOT, (0.5, 0.99)),
            "s",
        ),
        timeseries(
            "Smoothness",
            "1 = perfectly steady stream, lower = stutter (docs/metrics.md). The median "
            "request, the worst 10 % of requests, and all tokens together.",
            [
                target(quantile(0.5, SMOOTHNESS), "median request"),
                target(quantile(0.1, SMOOTHNESS), "p10 request"),
                target(SMOOTH_TOKENS, "token-weighted"),
            ],
            "none",
            min=0,
            max=1,
            thresholds=thresholds((None, "red"), (SMOOTHNESS_MIN, "transparent")),
        ),
        timeseries(
            "Stall rate",
            "Stalls: gaps >= stall factor x the request's median gap and >= the minimum gap.",
            [
                target(STALLS_PER_1K, "per 1000 tokens"),
                target(STALLS_PER_REQUEST, "per request"),
            ],
            "none",
        ),
        timeseries(
            "ITL mean and standard deviation",
            "Exact across pods, from the ITL histogram's sum and count and the sum of squares.",
            [target(ITL_MEAN, "mean"), target(ITL_STDDEV, "standard deviation")],
            "s",
        ),
        timeseries(
            "Request duration",
            "From the request reaching the sidecar to the end of its response.",
            quantiles(DURATION, (0.5, 0.99)),
            "s",
        ),
        timeseries(
            "Tokens per request",
            "Input (prompt) and output tokens per request, median and P99.",
            [
                # v1.41's histogram by type and (sidecars opted in to the newest GenAI
                # conventions) the histogram of the direction, summed: the same buckets
                target(
                    f"histogram_quantile({q}, sum by (le) ({rate(USAGE + '_bucket', by_type)}"
                    f" or {rate(latest + '_bucket')}))",
                    f"{kind} p{q * 100:g}",
                )
                for kind, latest in USAGE_BY_DIRECTION.items()
                for by_type in [MODEL + ', gen_ai_token_type="' + kind + '"']
                for q in (0.5, 0.99)
            ],
            "short",
        ),
        timeseries(
            "Engine-reported prefill and model load",
            "Prefill and model-load times as the engine itself reports them per request "
            "(Ollama's prompt_eval_duration and load_duration, llama.cpp's timings.prompt_ms); "
            "empty for other engines. "
            "Compare with TTFT, which adds queueing.",
            [
                target(quantile(0.5, ENGINE_PROMPT_EVAL), "prefill p50"),
                target(quantile(0.99, ENGINE_PROMPT_EVAL), "prefill p99"),
                target(quantile(0.99, ENGINE_LOAD), "model load p99"),
            ],
            "s",
        ),
    ]


def why_row() -> list[Json]:
    """Why it was slow: where the first token's wait went (docs/metrics.md, TTFT in phases)."""
    # each phase's seconds, from the native histogram where Prometheus keeps only that
    phases = (
        f"(sum by (phase) (histogram_sum({rate(TTFT_PHASE)})) "
        f"or sum by (phase) ({rate(TTFT_PHASE + '_sum')}))"
    )
    per_request = f"{phases} / scalar({native_total('count', TTFT)})"
    share = f"{phases} / scalar({native_total('sum', TTFT)})"
    return [
        timeseries(
            "TTFT by phase, per request",
            "The mean request's TTFT in its parts, stacked: before the engine (upload, "
            "sidecar, connecting), the engine's own load, queue and prefill where it reports "
            "them (Ollama, llama.cpp, vLLM with --enable-per-request-metrics), and the rest "
            "(network, tokenising, all of the engine's time when it reports nothing).",
            [target(per_request, "{{phase}}")],
            "s",
            stack=True,
            width=12,
        ),
        timeseries(
            "Share of TTFT by phase",
            "Which part of the wait for the first token grew: a rising queue share calls for "
            "replicas, a rising prefill share for shorter prompts or chunked prefill, "
            "before_engine for the clients' uploads or the connection to the engine.",
            [target(share, "{{phase}}")],
            "percentunit",
            stack=True,
            width=12,
            min=0,
            max=1,
        ),
        timeseries(
            "Stalls by cause",
            "Stalls per second by what caused them (docs/metrics.md, Stalls by cause): another "
            "request's prefill, a preemption (the KV cache full), the whole engine pausing, "
            "the client not reading, or unknown. Prefill interference calls for chunked "
            "prefill or shorter prompts, preemptions for more KV cache or fewer requests in "
            "the batch, engine pauses for the engine's own logs.",
            [target(f"sum by (cause) ({rate(STALLS)})", "{{cause}}")],
            "short",
            stack=True,
            width=12,
        ),
        timeseries(
            "SLO misses by cause",
            "Requests that missed an objective, per second, by objective and why: a TTFT miss "
            "under the phase that took most of its TTFT, a gap or stall miss under the cause "
            "of its longest stall, the rest under none.",
            [
                target(
                    f"sum by (objective, cause) ({rate(SLO_MISSES)}) > 0",
                    "{{objective}}: {{cause}}",
                )
            ],
            "reqps",
            stack=True,
            width=12,
        ),
    ]


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


def load_row() -> list[Json]:
    engine = (
        "From the engine's own /metrics, re-exported by the sidecar's engine collector under "
        "uniform names, labelled by engine (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM). Empty "
        'when the engine exports none of them (llmobs_collector_up{collector="engine"} is 0).'
    )
    return [
        timeseries(
            "Requests by operation",
            "Requests relayed per second by GenAI operation.",
            [
                target(
                    f"sum by (gen_ai_operation_name) ({rate(REQUESTS)})",
                    "{{gen_ai_operation_name}}",
                )
            ],
            "reqps",
            stack=True,
        ),
        timeseries(
            "In flight",
            "Requests in flight through the sidecar (streaming or not), per pod.",
            [target(f"sum by (pod) ({ACTIVE}{{{POD}}})", "{{pod}}")],
            "short",
            stack=True,
        ),
        timeseries(
            "Prefill queue depth",
            "Streaming requests forwarded upstream and still waiting for their first token: "
            "the engine's queue plus prefill, as users feel it.",
            [
                target(f"sum by (pod) ({QUEUE}{{{POD}}})", "{{pod}}"),
                target(
                    f"max_over_time(sum({QUEUE}{{{POD}}})[{RATE_INTERVAL}:])", "peak (all pods)"
                ),
            ],
            "short",
        ),
        timeseries(
            "Tokens per second",
            "Tokens per second by type, from the requests that finished: input, output, and "
            "within them cached_input and reasoning (parts, not to be added to the totals).",
            [target(f"sum by (gen_ai_token_type) ({rate(TOKENS)})", "{{gen_ai_token_type}}")],
            "short",
        ),
        timeseries(
            "Engine waiting / running",
            "Requests in the engine's own waiting queue and running batch. " + engine,
            [
                target(
                    f"sum by (pod, engine) ({metric}{{{POD}}})",
                    f"{{{{pod}}}} {what} ({{{{engine}}}})",
                )
                for metric, what in ((ENGINE_WAITING, "waiting"), (ENGINE_RUNNING, "running"))
            ],
            "short",
        ),
        timeseries(
            "Engine KV cache usage",
            "Fraction of the engine's KV cache in use (TGI reports none). Red above the "
            f"{KV_CACHE_MAX:.0%} alert default. " + engine,
            [target(f"max by (pod, engine) ({ENGINE_KV_CACHE}{{{POD}}})", "{{pod}} ({{engine}})")],
            "percentunit",
            min=0,
            max=1,
            thresholds=thresholds((None, "transparent"), (KV_CACHE_MAX, "red")),
        ),
        timeseries(
            "Engine prefix cache and speculation",
            "The share of prompt tokens the engine found in its prefix cache (vLLM's counters; "
            "SGLang's own ratio), and the share of speculative draft tokens it accepted: a "
            "falling cache ratio lengthens prefill, a falling acceptance slows decode. " + engine,
            [
                target(
                    f"sum by (pod, engine) ({rate(PREFIX_HITS, POD)}) / sum by (pod, engine) "
                    f"({rate(PREFIX_QUERIES, POD)}) or avg by (pod, engine) "
                    f"({PREFIX_RATIO}{{{POD}}})",
                    "{{pod}} prefix cache ({{engine}})",
                ),
                target(
                    f"sum by (pod, engine) ({rate(SPEC_ACCEPTED, POD)}) / sum by (pod, engine) "
                    f"({rate(SPEC_DRAFTED, POD)})",
                    "{{pod}} draft tokens accepted ({{engine}})",
                ),
            ],
            "percentunit",
            min=0,
            max=1,
        ),
        timeseries(
            "Engine preemptions",
            "Requests the engine preempted per second (the KV cache full): each stops its "
            "stream until recomputed (stalls by cause: preemption). " + engine,
            [target(f"sum by (pod, engine) ({rate(PREEMPTIONS, POD)})", "{{pod}} ({{engine}})")],
            "reqps",
        ),
    ]


def errors_row() -> list[Json]:
    return [
        timeseries(
            "Requests by outcome",
            "ok, client_disconnect, upstream_error, upstream_timeout, rejected: exactly one per "
            "request.",
            [target(f"sum by (outcome) ({rate(REQUESTS)})", "{{outcome}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "Requests by status class",
            "HTTP status class of the response the client got (0xx: none was sent).",
            [target(f"sum by (status_class) ({rate(REQUESTS)})", "{{status_class}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "Engine failure ratio",
            "Share of requests that failed at the engine (refused, reset, 5xx, timed out).",
            [target(FAILURE_RATIO, "failed at the engine")],
            "percentunit",
            min=0,
            thresholds=thresholds((None, "transparent"), (FAILURE_RATIO_MAX, "red")),
        ),
        timeseries(
            "Finish reasons",
            "Why responses ended: stop, length (cut at max_tokens), tool_calls, content_filter, "
            "error, aborted (the client went away), other, none.",
            [target(f"sum by (finish_reason) ({rate(REQUESTS)})", "{{finish_reason}}")],
            "reqps",
            stack=True,
            width=12,
        ),
        timeseries(
            "Output tokens by count source",
            "usage: the engine reported its token counts; counted: it did not, and one chunk "
            "counts as one token (ask for stream_options.include_usage for exact ITL per token).",
            [
                target(
                    f"sum by (token_count_source) "
                    f"({rate(TOKENS, MODEL + ', gen_ai_token_type=' + OUTPUT)})",
                    "{{token_count_source}}",
                )
            ],
            "short",
            stack=True,
            width=12,
        ),
    ]


def distribution_row() -> list[Json]:
    return [
        heatmap(
            "Inter-token latency heatmap",
            "Tokens per ITL bucket: periodic stalls show as a second band above the main one.",
            ITL,
        ),
        heatmap(
            "Time to first token heatmap",
            "Requests per TTFT bucket: a growing queue pushes the band up.",
            TTFT,
        ),
    ]


def per_gpu(metric: str, legend: str, by: str = "pod, gpu") -> Any:
    """One series per GPU of each pod (a MIG device is ``gpu="<gpu>/<n>"``)."""
    suffix = " " + legend if legend else ""
    return target(f"max by ({by}) ({metric}{{{POD}}})", "{{pod}}/{{gpu}}" + suffix)


def gpu_row() -> list[Json]:
    nvml = "Sampled from NVML by the sidecar's GPU collector, per GPU it sees (docs/gpu.md)."
    used, total = GPU_MEMORY["used"], GPU_MEMORY["total"]
    return [
        timeseries(
            "GPU memory",
            "Device memory in use, reserved by the driver, free and in total. Engines allocate "
            "their KV cache up front, so a high, flat line is normal. A GPU in MIG mode has no "
            f"memory series of its own, its MIG devices do. {nvml}",
            [
                per_gpu(used, "used"),
                per_gpu(GPU_MEMORY["reserved"], "reserved"),
                per_gpu(GPU_MEMORY["free"], "free"),
                per_gpu(total, "total"),
            ],
            "bytes",
            min=0,
        ),
        timeseries(
            "GPU memory used",
            f"Memory used / total per GPU. Red above the {GPU_MEMORY_MAX:.0%} alert default, "
            "where any allocation outside the engine's pool (CUDA graphs, another process) "
            "fails.",
            [target(f"max by (pod, gpu) ({used}{{{POD}}} / {total}{{{POD}}})", "{{pod}}/{{gpu}}")],
            "percentunit",
            min=0,
            max=1,
            thresholds=thresholds((None, "transparent"), (GPU_MEMORY_MAX, "red")),
        ),
        timeseries(
            "GPU utilization",
            "Kernel: fraction of the sample period in which a kernel ran (not how much of the "
            "GPU it used). Memory controller: fraction in which device memory was read or "
            f"written. NVML reports neither in MIG mode. {nvml}",
            [
                per_gpu(GPU_UTILIZATION, "kernel"),
                per_gpu(GPU_MEMORY_CONTROLLER, "memory controller"),
            ],
            "percentunit",
            min=0,
            max=1,
        ),
        timeseries(
            "Memory bandwidth: measured vs MBU",
            "Measured: DRAM bandwidth used / peak per GPU, by source: gpm (NVML GPM, Hopper and "
            "newer) is the bandwidth moved; mem_util (the memory-controller busy ratio, older "
            "GPUs) is only an upper bound, never compare it with MBU. MBU: the bandwidth the "
            "model needs at its measured TPOT (weights + KV cache read per decode step / TPOT / "
            "peak), per model, needs --model-params; over several GPUs it divides by the sum "
            "of their peaks, so compare it with their average. Under steady decode GPM reads at "
            "or a little above MBU; well above points at bytes the model does not need, below "
            "at a wrong shape or peak.",
            [
                target(
                    f"max by (pod, gpu, source) ({GPU_BANDWIDTH_UTILIZATION}{{{POD}}})",
                    "{{pod}}/{{gpu}} measured ({{source}})",
                ),
                target(
                    f"max by (pod, gen_ai_request_model) ({MBU}{{{MODEL}}})",
                    "{{pod}} MBU {{gen_ai_request_model}}",
                ),
            ],
            "percentunit",
            width=12,
            min=0,
            max=1,
        ),
        timeseries(
            "Memory bandwidth: achieved vs peak",
            "Achieved DRAM bandwidth (the utilization on the left x the peak), by source, and "
            "the peak: max memory clock x bus width x 2 from NVML, or --gpu-peak-bandwidth.",
            [
                per_gpu(GPU_BANDWIDTH, "achieved ({{source}})", by="pod, gpu, source"),
                per_gpu(GPU_BANDWIDTH_PEAK, "peak"),
            ],
            "Bps",
            width=12,
            min=0,
        ),
        timeseries(
            "MFU (prefill)",
            "Model FLOPs utilization of prefill over the last minute: 2 x params x prompt "
            "tokens / prefill time / peak FLOP/s. Prefill time is TTFT (queueing included: a "
            "lower bound) unless the engine reports its own. Needs --gpu-peak-flops.",
            [
                target(
                    f"max by (pod, gen_ai_request_model) ({MFU}{{{MODEL}}})",
                    "{{pod}} {{gen_ai_request_model}}",
                )
            ],
            "percentunit",
            width=6,
            min=0,
        ),
        timeseries(
            "GPU power",
            f"Power draw per GPU. {nvml}",
            [per_gpu(GPU_POWER, "")],
            "watt",
            width=6,
            min=0,
        ),
        timeseries(
            "GPU temperature",
            f"GPU die temperature. {nvml}",
            [per_gpu(GPU_TEMPERATURE, "")],
            "celsius",
            width=6,
        ),
        timeseries(
            "GPU clocks",
            "Current SM and memory clocks: an SM clock below its usual value under load means "
            "power or thermal throttling.",
            [
                per_gpu(GPU_CLOCK["sm"], "SM"),
                per_gpu(GPU_CLOCK["memory"], "memory"),
            ],
            "hertz",
            width=6,
        ),
    ]


def sidecar_cost() -> list[Json]:
    """The sidecar's own CPU, memory, descriptors, collections and build (job="llmobs": an
    engine written in Python has process_* of its own)."""
    own = f'job="llmobs", {POD}'
    return [
        timeseries(
            "Sidecar CPU",
            "CPU the sidecar uses, in cores (user + system), and per output token: what "
            "observing the stream costs.",
            [
                target(f"sum by (pod) ({rate(PROCESS_CPU, own)})", "{{pod}} cores"),
                target(
                    f"1e6 * sum({rate(PROCESS_CPU, own)}) / {ITL_COUNT}",
                    "µs per token",
                ),
            ],
            "short",
            width=6,
            min=0,
        ),
        timeseries(
            "Sidecar memory",
            "Resident and virtual memory of the sidecar process.",
            [
                target(f"max by (pod) ({PROCESS_RSS}{{{own}}})", "{{pod}} resident"),
                target(f"max by (pod) ({PROCESS_VMS}{{{own}}})", "{{pod}} virtual"),
            ],
            "bytes",
            width=6,
            min=0,
        ),
        timeseries(
            "Sidecar file descriptors",
            "Open descriptors (one per client and engine connection, plus a few) against the "
            "limit: at the limit, new connections fail.",
            [
                target(f"max by (pod) ({PROCESS_FDS}{{{own}}})", "{{pod}} open"),
                target(f"min by (pod) ({PROCESS_MAX_FDS}{{{own}}})", "{{pod}} limit"),
            ],
            "short",
            width=6,
            min=0,
        ),
        timeseries(
            "Sidecar garbage collection",
            "Collections per second by generation, and objects freed; a burst of generation "
            "2 collections shows in the ITL as pauses.",
            [
                target(
                    f"sum by (generation) ({rate(GC_COLLECTIONS, own)})",
                    "gen {{generation}} collections/s",
                ),
                target(f"sum({rate(GC_COLLECTED, own)})", "objects freed/s"),
                target(f"sum({rate(GC_UNCOLLECTABLE, own)})", "uncollectable/s"),
            ],
            "short",
            width=6,
            min=0,
        ),
        timeseries(
            "Sidecar build and uptime",
            "Seconds since each sidecar started, labelled with its llmobs version, Python, "
            "event loop and JSON parser.",
            [
                target(
                    f"(time() - max by (pod) ({PROCESS_START}{{{own}}})) * on (pod) "
                    f"group_left (version, python, event_loop, json) "
                    f"max by (pod, version, python, event_loop, json) ({BUILD_INFO}{{{own}}})",
                    "{{pod}} llmobs {{version}}, Python {{python}}, {{event_loop}}, {{json}}",
                ),
                target(
                    f"count by (implementation, version) ({PYTHON_INFO}{{{own}}})",
                    "{{implementation}} {{version}}: pods",
                ),
            ],
            "s",
            width=24,
            min=0,
        ),
    ]


def health_row() -> list[Json]:
    return [
        timeseries(
            "Observer errors and malformed events",
            "Observer errors (the relay carried on, metrics incomplete) and malformed stream "
            "events (relayed, not timed). Both should be 0.",
            [
                target(f"sum({rate(OBSERVER_ERRORS, POD)})", "observer errors/s"),
                target(f"sum({rate(MALFORMED, POD)})", "malformed events/s"),
            ],
            "short",
        ),
        timeseries(
            "Collectors up",
            "1 when the collector's last poll read something; 0 when there is no GPU or NVML, "
            "the engine's /metrics is unreachable or names nothing known, or polling fails. "
            "Turn a collector with nothing to collect off (interval 0): it then has no series.",
            [target(f"min by (pod, collector) ({COLLECTOR_UP}{{{POD}}})", "{{pod}} {{collector}}")],
            "short",
            min=0,
            max=1,
            decimals=0,
        ),
        timeseries(
            "Spans dropped",
            "Spans dropped because trace export falls behind (the export queue or the backlog "
            "of unwritten traces was full): traces are missing, the relay is unaffected. Only "
            "exported when tracing is on.",
            [target(f"sum by (pod) ({rate(SPANS_DROPPED, POD)})", "{{pod}}")],
            "short",
            min=0,
        ),
        timeseries(
            "Collector errors",
            "Unexpected collector failures per second: failed polls, or one GPU or field that "
            "failed while the others were read. An absent GPU or engine is not an error.",
            [
                target(
                    f"sum by (pod, collector) ({rate(COLLECTOR_ERRORS, POD)})",
                    "{{pod}} {{collector}}",
                )
            ],
            "short",
            width=12,
            min=0,
        ),
        timeseries(
            "Collector poll duration",
            "How long each collector's last poll took (NVML calls, the engine's /metrics).",
            [
                target(
                    f"max by (pod, collector) ({COLLECTOR_DURATION}{{{POD}}})",
                    "{{pod}} {{collector}}",
                )
            ],
            "s",
            width=12,
            min=0,
        ),
        *sidecar_cost(),
    ]


def row(title: str) -> Json:
    return built(dashboard_builders.Row(title).collapsed(False))


def layout(rows: Sequence[tuple[str, list[Json]]]) -> list[Json]:
    """Ids and grid positions, left to right, wrapping at Grafana's 24 columns."""
    out: list[Json] = []
    y = 0
    for title, panels in rows:
        header = row(title)
        header["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
        out.append(header)
        y += 1
        x = line_h = 0
        for p in panels:
            w, h = p["gridPos"]["w"], p["gridPos"]["h"]
            if x + w > 24:
                y, x, line_h = y + line_h, 0, 0
            p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            x, line_h = x + w, max(line_h, h)
            out.append(p)
        y += line_h
    for i, p in enumerate(out, start=1):
        p["id"] = i
    return out


def variable(name: str, label: str, query: str) -> Any:
    """A multi-value query variable over a label, "All" by default."""
    every = dashboard_models.VariableOption(selected=True, text=["All"], value=["$__all"])
    return (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": "StandardVariableQuery"})
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .current(every)
        .options([])
        .regex("")
        .sort(dashboard_models.VariableSort.ALPHABETICAL_ASC)
        .hide(dashboard_models.VariableHide.DONT_HIDE)
    )


def window_variable() -> Any:
    """The range the SLO panels measure attainment and budget over (a Prometheus range)."""
    options = ["1h", "1d", "7d", "28d", "30d"]
    return (
        dashboard_builders.CustomVariable("slo_window")
        .label("SLO window")
        .values(",".join(options))
        .current(dashboard_models.VariableOption(selected=True, text="28d", value="28d"))
        .options(
            [dashboard_models.VariableOption(selected=o == "28d", text=o, value=o) for o in options]
        )
        .include_all(False)
        .multi(False)
        .hide(dashboard_models.VariableHide.DONT_HIDE)
    )


def dashboard() -> Json:
    datasource = (
        dashboard_builders.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .current(dashboard_models.VariableOption(text="", value=""))
        .regex("")
        .hide(dashboard_models.VariableHide.DONT_HIDE)
    )
    rows = [
        ("Overview", [*overview_row(), worst_pods()]),
        ("Service-level objectives", slo_row()),
        ("User experience", experience_row()),
        ("Why it was slow", why_row()),
        ("Who it was slow for, and what it cost", tenants_row()),
        ("Load", load_row()),
        ("Errors and outcomes", errors_row()),
        ("Distributions", distribution_row()),
        ("GPU", gpu_row()),
        ("Sidecar health", health_row()),
    ]
    runbook = (
        dashboard_builders.DashboardLink("Runbook")
        .type(dashboard_models.DashboardLinkType.LINK)
        .url("https://github.com/llmobs/llmobs/blob/main/docs/runbook.md")
        .target_blank(True)
        .icon("doc")
    )
    alerts = (
        dashboard_builders.AnnotationQuery()
        .name("Annotations & Alerts")
        .datasource(dashboard_models.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .type("dashboard")
        .built_in(1)
    )
    board = (
        dashboard_builders.Dashboard("llmobs: LLM serving")
        .uid("llmobs")
        .description(
            "What users of an LLM inference server feel, measured by the llmobs sidecar: TTFT, "
            "inter-token latency, stutter, queue, errors, GPU and MBU."
        )
        .tags(["llmobs", "llm", "gen-ai", "inference"])
        .timezone("browser")
        .editable()
        .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .fiscal_year_start_month(0)
        .live_now(False)
        .week_start("")
        .version(1)
        .link(runbook)
        .annotation(alerts)
        .with_variable(datasource)
        .with_variable(variable("namespace", "Namespace", f"label_values({ACTIVE}, namespace)"))
        .with_variable(
            variable("job", "Job", f'label_values({ACTIVE}{{namespace=~"$namespace"}}, job)')
        )
        .with_variable(
            variable(
                "pod",
                "Pod",
                f'label_values({ACTIVE}{{namespace=~"$namespace", job=~"$job"}}, pod)',
            )
        )
        .with_variable(
            variable("model", "Model", f"label_values({REQUESTS}{{{POD}}}, gen_ai_request_model)")
        )
        .with_variable(window_variable())
    )
    out = built(board)
    for found in out["templating"]["list"]:  # the query as Grafana's editor shows it: outside
        if found["type"] == "query":  # the schema, written by every Grafana export
            found["definition"] = found["query"]["query"]
    out["panels"] = layout(rows)
    # an export's header: what importing it in Grafana's UI asks for (no part of the schema)
    requires = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    ]
    return {"__requires": requires, "id": None, **out}


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if llmobs.json is stale")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON goes")
    args = parser.parse_args(argv)
    text_ = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text_:
            print(f"{args.out} is stale: run python dashboards/generate.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text_)
    return 0


if __name__ == "__main__":
    sys.exit(main())
