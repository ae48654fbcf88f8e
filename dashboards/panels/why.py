"""Why it was slow: where the first token's wait went (TTFT in phases), what caused the
stalls, and why SLOs were missed (docs/metrics.md).
"""

from __future__ import annotations

from panels.builders import Json, target, timeseries
from panels.names import SLO_MISSES, STALLS, TTFT, TTFT_PHASE
from panels.promql import native_total, rate


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
