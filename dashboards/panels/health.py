"""The sidecar's own health: observer and collector errors, spans dropped, and what running
the sidecar costs (CPU per token, memory, descriptors, collections, build and uptime).
"""

from __future__ import annotations

from panels.builders import Json, target, timeseries
from panels.names import (
    BUILD_INFO,
    COLLECTOR_DURATION,
    COLLECTOR_ERRORS,
    COLLECTOR_UP,
    GC_COLLECTED,
    GC_COLLECTIONS,
    GC_UNCOLLECTABLE,
    MALFORMED,
    OBSERVER_ERRORS,
    PROCESS_CPU,
    PROCESS_FDS,
    PROCESS_MAX_FDS,
    PROCESS_RSS,
    PROCESS_START,
    PROCESS_VMS,
    PYTHON_INFO,
    SPANS_DROPPED,
    TLS_EXPIRY,
    TLS_HANDSHAKES,
    TLS_RELOADS,
    WS_ACTIVE,
    WS_DURATION,
    WS_MESSAGES,
    WS_SESSIONS,
)
from panels.promql import ITL_COUNT, POD, quantile, rate


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
    """Whether the sidecar's own measurements can be trusted, then what it costs."""
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
            "1 when the collector's last poll read something; 0 when a GPU stopped answering, "
            "the engine's /metrics is unreachable or names nothing known, or polling fails. "
            "A node without a GPU has no GPU series at all (the collector turns itself off).",
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
        *transports(),
        *websockets(),
        *sidecar_cost(),
    ]


def websockets() -> list[Json]:
    """WebSocket sessions relayed: open now, ended by outcome, messages, how long they last
    (the realtime turns' latencies are on the experience row)."""
    return [
        timeseries(
            "WebSocket sessions",
            "Sessions open now (realtime: vLLM's /v1/realtime), sessions ended per second by "
            "outcome (idle_timeout, too_large, client_timeout: the sidecar's limits ended them), "
            "and messages per second each way.",
            [
                target(f"sum by (api) ({WS_ACTIVE}{{{POD}}})", "open {{api}}"),
                target(f"sum by (outcome) ({rate(WS_SESSIONS, POD)})", "ended {{outcome}}"),
                target(f"sum by (source) ({rate(WS_MESSAGES, POD)})", "messages from {{source}}"),
            ],
            "short",
            width=12,
            min=0,
        ),
        timeseries(
            "WebSocket session duration",
            "Median and p99 length of the sessions that ended, from the engine's 101 on.",
            [target(quantile(q, WS_DURATION, POD), f"p{round(q * 100)}") for q in (0.5, 0.99)],
            "s",
            width=12,
            min=0,
        ),
    ]


def transports() -> list[Json]:
    """TLS, where it is on: handshakes by how they ended, reloads, and days to expiry."""
    return [
        timeseries(
            "TLS handshakes and certificate reloads",
            "Handshakes per second on the proxy port by result (anything but ok: a client "
            "without the right certificate, plain HTTP sent to the TLS port, a client that "
            "never finished), and certificate files read again (error: the old one stays).",
            [
                target(f"sum by (result) ({rate(TLS_HANDSHAKES, POD)})", "handshakes {{result}}"),
                target(
                    f"sum by (certificate, result) ({rate(TLS_RELOADS, POD)})",
                    "{{certificate}} reloads {{result}}",
                ),
            ],
            "short",
            width=12,
            min=0,
        ),
        timeseries(
            "Days until the certificate expires",
            "The certificate in use on each pod (serving: the proxy's and metrics port's; "
            "client: the one shown to the engine): a rotation that never came shows here.",
            [
                target(
                    f"min by (pod, certificate) ({TLS_EXPIRY}{{{POD}}} - time()) / 86400",
                    "{{pod}} {{certificate}}",
                )
            ],
            "d",
            width=12,
        ),
    ]
