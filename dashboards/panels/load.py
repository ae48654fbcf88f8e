"""The load row: requests, in-flight and queued streams, tokens per second, and the engine's
own queue, KV cache, prefix cache, speculation and preemptions (its collector's series).
"""

from __future__ import annotations

from panels.builders import Json, target, thresholds, timeseries
from panels.names import (
    ACTIVE,
    ENGINE_KV_CACHE,
    ENGINE_RUNNING,
    ENGINE_WAITING,
    KV_CACHE_MAX,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PREFIX_RATIO,
    QUEUE,
    REQUESTS,
    SPEC_ACCEPTED,
    SPEC_DRAFTED,
    TOKENS,
)
from panels.promql import POD, RATE_INTERVAL, rate


def load_row() -> list[Json]:
    """How much the sidecar relays and how full the engine is behind it."""
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
