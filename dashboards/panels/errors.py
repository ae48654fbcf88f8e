"""The errors and outcomes row: one outcome per request, status classes, the engine's failure
ratio, finish reasons, and whether the engine or the sidecar counted the tokens.
"""

from __future__ import annotations

from panels.builders import Json, target, thresholds, timeseries
from panels.names import API_REQUESTS, FAILURE_RATIO_MAX, REQUESTS, TOKENS
from panels.promql import FAILURE_RATIO, MODEL, OUTPUT, POD, rate


def errors_row() -> list[Json]:
    """How requests ended, and who counted their tokens."""
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
        timeseries(
            "Requests by API and transport",
            "The API each request spoke (openai, anthropic, ..., vllm-grpc, triton-grpc) over "
            "http or grpc; a gRPC call's status code (none: HTTP). Every model's: the family has "
            "no model label.",
            [
                target(
                    f"sum by (api, transport, rpc_grpc_status_code) ({rate(API_REQUESTS, POD)})",
                    "{{api}} {{transport}} {{rpc_grpc_status_code}}",
                )
            ],
            "reqps",
            stack=True,
            width=24,
        ),
    ]
