"""What users feel of a stream: TTFT, ITL, TPOT, smoothness, stalls, duration and tokens per
request as quantiles, and the distributions of ITL and TTFT as heatmaps.
"""

from __future__ import annotations

from collections.abc import Iterable

from panels.builders import Json, heatmap, target, thresholds, timeseries
from panels.names import (
    DURATION,
    ENGINE_LOAD,
    ENGINE_PROMPT_EVAL,
    ITL,
    ITL_SLO,
    REALTIME_DELTA_GAP,
    REALTIME_FIRST_DELTA,
    REALTIME_TURNS,
    SMOOTHNESS,
    SMOOTHNESS_MIN,
    TPOT,
    TTFT,
    TTFT_SLO,
    USAGE,
    USAGE_BY_DIRECTION,
)
from panels.promql import (
    ITL_MEAN,
    ITL_STDDEV,
    MODEL,
    SMOOTH_TOKENS,
    STALLS_PER_1K,
    STALLS_PER_REQUEST,
    quantile,
    rate,
)

UNANSWERED = MODEL + ', outcome!="done"'  # realtime turns that ended in an error or were cut


def experience_row() -> list[Json]:
    """A stream as its user feels it, as quantiles over every request chosen."""

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
        timeseries(
            "Realtime turns (WebSocket)",
            "vLLM's /v1/realtime and OpenAI Realtime sessions: from a committed input to the "
            "first delta of its answer (a turn's time to first token), the gaps between "
            "deltas (its ITL), and turns that ended in an error or were cut short per second.",
            [
                target(quantile(0.5, REALTIME_FIRST_DELTA), "first delta p50"),
                target(quantile(0.99, REALTIME_FIRST_DELTA), "first delta p99"),
                target(quantile(0.99, REALTIME_DELTA_GAP), "delta gap p99"),
                target(
                    f"sum by (outcome) ({rate(REALTIME_TURNS, UNANSWERED)})", "turns {{outcome}}"
                ),
            ],
            "s",
        ),
    ]


def distribution_row() -> list[Json]:
    """Where the mass of ITLs and TTFTs lies: a second band is a periodic stall."""
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
