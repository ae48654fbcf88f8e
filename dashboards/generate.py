"""Builds dashboards/llmobs.json, the main Grafana dashboard, from the rows defined below.

Dashboards as code: edit this file, run ``python dashboards/generate.py``, commit both.
``--check`` exits 1 when the committed JSON is not what this script builds (CI runs it through
tests/test_dashboards.py). Every query uses only metrics of ``llmobs/metrics.py``'s CATALOGUE,
plus the engine's own vLLM gauges where a panel says "scraped directly" (the test allowlists
exactly those); template variables: datasource, namespace, pod, model.

The GPU row is a placeholder: the NVML collector (issue 5) adds its metrics to the catalogue,
and its panels go into ``gpu_row()`` as the other rows are built.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().with_name("llmobs.json")

Json = dict[str, Any]

DS: Json = {"type": "prometheus", "uid": "${datasource}"}
POD = 'namespace=~"$namespace", pod=~"$pod"'
MODEL = POD + ', gen_ai_request_model=~"$model"'
RI = "$__rate_interval"

TTFT = "gen_ai_server_time_to_first_token_seconds"
TPOT = "gen_ai_server_time_per_output_token_seconds"
DURATION = "gen_ai_server_request_duration_seconds"
USAGE = "gen_ai_client_token_usage"
TOKENS = "llmobs_tokens_total"
ENGINE_PROMPT_EVAL = "llmobs_engine_prompt_eval_duration_seconds"
ENGINE_LOAD = "llmobs_engine_load_duration_seconds"
ITL = "llmobs_inter_token_latency_seconds"
ITL_SQUARES = "llmobs_inter_token_latency_seconds_squared_total"
STALLS = "llmobs_stalls_total"
SMOOTHNESS = "llmobs_smoothness"
REQUESTS = "llmobs_requests_total"
ACTIVE = "llmobs_requests_active"
QUEUE = "llmobs_prefill_queue_depth"
MALFORMED = "llmobs_stream_malformed_events_total"
OBSERVER_ERRORS = "llmobs_observer_errors_total"
FAILED = 'outcome=~"upstream_error|upstream_timeout"'

# Alert defaults (deploy/prometheus/alerts.yml), drawn as thresholds.
TTFT_SLO = 2.0
ITL_SLO = 0.15
SMOOTHNESS_MIN = 0.8
STALLS_PER_1K_MAX = 5.0
FAILURE_RATIO_MAX = 0.05


def rate(metric: str, selector: str = MODEL, fn: str = "rate") -> str:
    return f"{fn}({metric}{{{selector}}}[{RI}])"


def quantile(q: float, histogram: str, selector: str = MODEL) -> str:
    inner = rate(histogram + "_bucket", selector)
    return f"histogram_quantile({q}, sum by (le) ({inner}))"


def total(metric: str, selector: str = MODEL) -> str:
    return f"sum({rate(metric, selector)})"


ITL_MEAN = f"{total(ITL + '_sum')} / {total(ITL + '_count')}"
ITL_STDDEV = (
    f"sqrt(clamp_min({total(ITL_SQUARES)} / {total(ITL + '_count')} - ({ITL_MEAN}) ^ 2, 0))"
)
SMOOTH_TOKENS = f"{total(ITL + '_sum')} ^ 2 / ({total(ITL + '_count')} * {total(ITL_SQUARES)})"
STALLS_PER_1K = f"1000 * ({total(STALLS)} or vector(0)) / {total(ITL + '_count')}"
FAILURE_RATIO = f"({total(REQUESTS, MODEL + ', ' + FAILED)} or vector(0)) / {total(REQUESTS)}"
OK_REQUESTS = MODEL + ', outcome="ok"'
OUTPUT = '"output"'
STALLS_PER_REQUEST = f"({total(STALLS)} or vector(0)) / {total(REQUESTS, OK_REQUESTS)}"


def target(expr: str, legend: str = "__auto", **extra: Any) -> Json:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "range": True, **extra}


def thresholds(*steps: tuple[float | None, str]) -> Json:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def panel(
    kind: str,
    title: str,
    description: str,
    targets: Sequence[Json],
    unit: str = "short",
    width: int = 8,
    height: int = 8,
    **defaults: Any,
) -> Json:
    refs = "ABCDEFGH"
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [{**t, "refId": refs[i]} for i, t in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit, **defaults}, "overrides": []},
        "gridPos": {"h": height, "w": width},
    }


def timeseries(
    title: str,
    description: str,
    targets: Sequence[Json],
    unit: str = "short",
    stack: bool = False,
    width: int = 8,
    **defaults: Any,
) -> Json:
    p = panel("timeseries", title, description, targets, unit, width, **defaults)
    p["fieldConfig"]["defaults"].setdefault(
        "custom",
        {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if stack else 0,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line" if "thresholds" in defaults else "off"},
        },
    )
    p["options"] = {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return p


def stat(title: str, description: str, expr: str, unit: str, steps: Json, **defaults: Any) -> Json:
    p = panel("stat", title, description, [target(expr, title)], unit, 4, 4, **defaults)
    p["fieldConfig"]["defaults"]["thresholds"] = steps
    p["options"] = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background",
        "graphMode": "area",
        "textMode": "value",
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return p


def heatmap(title: str, description: str, histogram: str) -> Json:
    expr = f"sum by (le) ({rate(histogram + '_bucket', fn='increase')})"
    p = panel("heatmap", title, description, [target(expr, "{{le}}", format="heatmap")], "s", 12)
    p["options"] = {
        "calculate": False,
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5},
        "yAxis": {"axisPlacement": "left", "unit": "s"},
        "rowsFrame": {"layout": "auto"},
        "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": True},
        "legend": {"show": True},
        "filterValues": {"le": 1e-9},
    }
    return p


def text(title: str, content: str, width: int = 24, height: int = 4) -> Json:
    return {
        "type": "text",
        "title": title,
        "options": {"mode": "markdown", "content": content},
        "gridPos": {"h": height, "w": width},
    }


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


def experience_row() -> list[Json]:
    def quantiles(histogram: str, qs: Iterable[float]) -> list[Json]:
        return [target(quantile(q, histogram), f"p{q * 100:g}") for q in qs]

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
                target(
                    f"histogram_quantile({q}, sum by (le, gen_ai_token_type) "
                    f"({rate(USAGE + '_bucket')}))",
                    f"{{{{gen_ai_token_type}}}} p{q * 100:g}",
                )
                for q in (0.5, 0.99)
            ],
            "short",
        ),
        timeseries(
            "Engine-reported prefill and model load",
            "Prefill and model-load times as the engine itself reports them per request "
            "(Ollama's prompt_eval_duration and load_duration); empty for other engines. "
            "Compare with TTFT, which adds queueing.",
            [
                target(quantile(0.5, ENGINE_PROMPT_EVAL), "prefill p50"),
                target(quantile(0.99, ENGINE_PROMPT_EVAL), "prefill p99"),
                target(quantile(0.99, ENGINE_LOAD), "model load p99"),
            ],
            "s",
        ),
    ]


def load_row() -> list[Json]:
    engine = "Engine gauges from the engine's own /metrics (vLLM names), scraped directly; empty "
    engine += "for engines that do not export them."
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
                target(f"max_over_time(sum({QUEUE}{{{POD}}})[{RI}:])", "peak (all pods)"),
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
            "Engine waiting / running (scraped directly)",
            engine,
            [
                target(f"sum(vllm:num_requests_waiting{{{POD}}})", "waiting"),
                target(f"sum(vllm:num_requests_running{{{POD}}})", "running"),
            ],
            "short",
        ),
        timeseries(
            "Engine KV cache usage (scraped directly)",
            engine,
            [target(f"max by (pod) (vllm:kv_cache_usage_perc{{{POD}}})", "{{pod}}")],
            "percentunit",
            min=0,
            max=1,
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
            "Sidecar internals",
            "Observer errors (the relay carried on, metrics incomplete) and malformed stream "
            "events (relayed, not timed). Both should be 0.",
            [
                target(f"sum({rate(OBSERVER_ERRORS, POD)})", "observer errors/s"),
                target(f"sum({rate(MALFORMED, POD)})", "malformed events/s"),
            ],
            "short",
        ),
        timeseries(
            "Finish reasons",
            "Why responses ended: stop, length (cut at max_tokens), tool_calls, content_filter, "
            "error, aborted (the client went away), other, none.",
            [target(f"sum by (finish_reason) ({rate(REQUESTS)})", "{{finish_reason}}")],
            "reqps",
            stack=True,
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


def gpu_row() -> list[Json]:
    # Filled by the NVML collector (issue 5): memory used, memory-bandwidth utilisation, MBU.
    return [
        text(
            "GPU",
            "GPU panels (memory used, memory-bandwidth utilisation, MBU) arrive with the NVML "
            "collector; see docs/runbook.md, *Arrives with the collectors*.",
        )
    ]


def row(title: str) -> Json:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


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


def variable(name: str, label: str, query: str) -> Json:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": "StandardVariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def dashboard() -> Json:
    datasource = {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "current": {},
        "options": [],
        "refresh": 1,
        "regex": "",
        "hide": 0,
    }
    rows = [
        ("Overview", overview_row()),
        ("User experience", experience_row()),
        ("Load", load_row()),
        ("Errors and outcomes", errors_row()),
        ("Distributions", distribution_row()),
        ("GPU", gpu_row()),
    ]
    return {
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ],
        "id": None,
        "uid": "llmobs",
        "title": "llmobs: LLM serving",
        "description": "What users of an LLM inference server feel, measured by the llmobs "
        "sidecar: TTFT, inter-token latency, stutter, queue, errors.",
        "tags": ["llmobs", "llm", "gen-ai", "inference"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [
            {
                "type": "link",
                "title": "Runbook",
                "url": "https://github.com/llmobs/llmobs/blob/main/docs/runbook.md",
                "targetBlank": True,
                "icon": "doc",
            }
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                datasource,
                variable("namespace", "Namespace", f"label_values({ACTIVE}, namespace)"),
                variable("pod", "Pod", f'label_values({ACTIVE}{{namespace=~"$namespace"}}, pod)'),
                variable(
                    "model", "Model", f"label_values({REQUESTS}{{{POD}}}, gen_ai_request_model)"
                ),
            ]
        },
        "panels": layout(rows),
    }


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
