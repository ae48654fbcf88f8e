"""The one catalogue of metrics: every name, unit, bucket set and label set is defined here.

Dashboards, alert rules and docs/metrics.md take their names from ``CATALOGUE`` (and are tested
against it). Names follow the OpenTelemetry GenAI semantic conventions where one exists
(``gen_ai.server.*``, ``gen_ai.client.token.usage`` with ``gen_ai.token.type`` as of v1.41;
with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` the token usage of the
newest conventions instead, ``LATEST_USAGE``) and ``llmobs.*`` otherwise; the OpenTelemetry
Prometheus exporter's rules turn them into Prometheus names (dots to underscores, the unit as
a suffix, ``_total`` on counters), which ``MetricDef.prometheus`` spells out.

Buckets are chosen for LLM latencies, never the SDK defaults: ITL needs resolution from 1 ms
(speculative decoding on an H100) to seconds (a stalled CPU engine); TTFT from 10 ms to minutes
(a long queue).

Adding a metric: its ``MetricDef`` here (and in ``REQUEST_METRICS`` for a per-request one, in
the order /metrics lists it), its recording (``sink.MetricsSink``, or a collector), its test.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from llmobs.config.buckets import FAMILIES as BUCKET_FAMILIES
from llmobs.config.tenants import METRIC_NAMES as TENANT_METRIC_NAMES
from llmobs.export.metrics.native import Layout
from llmobs.observe.labels import UNKNOWN


class Kind(enum.StrEnum):
    COUNTER = "counter"
    UPDOWN = "updowncounter"  # exported to Prometheus as a gauge
    HISTOGRAM = "histogram"
    TOKEN_HISTOGRAM = "token_histogram"  # bulk-recorded histogram, see module docstring
    GAUGE = "gauge"  # observable gauge: a background collector's snapshot, read at scrape


# Label (attribute) names. GenAI names where the conventions define one.
OPERATION = "gen_ai.operation.name"
MODEL = "gen_ai.request.model"
TOKEN_TYPE = "gen_ai.token.type"  # v1.41's; the newest conventions split usage by name
PROVIDER = "gen_ai.provider.name"  # one value per sidecar (config.provider): the engine
MODALITY = "gen_ai.token.modality"  # the newest usage counters'
NO_MODALITY = UNKNOWN  # its value here: no engine reports usage by modality
OUTCOME = "outcome"
STATUS_CLASS = "status_class"
FINISH_REASON = "finish_reason"
TOKEN_SOURCE = "token_count_source"
VERDICT = "verdict"  # good, bad (llmobs.slo)
PHASE = "phase"  # a part of TTFT (llmobs.observe.phases.Phase)
OBJECTIVE = "objective"  # the objective a bad request missed (llmobs.slo.Objective)
CAUSE = "cause"  # why: a stall's (llmobs.observe.causes.StallCause), a miss's (slo.miss_cause)
TENANT = "tenant"  # who: the operator's name for a tenant (--tenant-header, --tenant-keys)
CURRENCY = "currency"  # the price file's currency (one per sidecar)

_OP_MODEL = (OPERATION, MODEL)
_GENAI = (OPERATION, MODEL, PROVIDER)  # the GenAI conventions' families: provider required

_UNIT_SUFFIX = {
    "s": "_seconds", "By": "_bytes", "By/s": "_bytes_per_second", "W": "_watts",
    "Cel": "_celsius", "Hz": "_hertz",
}  # fmt: skip

LATENCY_BUCKETS = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025,
    0.03, 0.035, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0,
    5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0,
    120.0, 180.0, 300.0, 600.0,
)  # fmt: skip
SMOOTHNESS_BUCKETS = (
    0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 0.999, 1.0,
)  # fmt: skip
TOKEN_BUCKETS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0)

# Native histograms (metrics.native). The per-request latencies start at schema 5: buckets
# 2.2 % wide, so a quantile read by Prometheus 2.x (linear inside a bucket) is off by at most
# 2.2 %, within the 3 % a latency objective needs; schema 3 (client_golang's usual factor 1.1)
# could be 9 % off. 160 buckets cover a 32x range (say 20-640 ms) at that resolution; a wider
# distribution drops to schema 4 (1024x, 4.4 %), then 3 (10^6 x, 9 %). The per-token ITL is
# observed a hundred times as often, on the relay's hot path, and its cost grows with the
# buckets a window's gaps fall in: schema 3 (9 %), still finer than its classic buckets
# (20-150 % apart above 0.1 s), covers 1 us to 1 s in 160 buckets, and costs per token half
# of schema 5 on a spread-out stream (docs/benchmarks.md). The smoothness score lives in
# (0, 1], where 0.98 and 0.99 must differ: schema 6 (1.1 %); 160 buckets reach down to 0.18.
LATENCY_NATIVE = Layout(schema=5, limit=160)
ITL_NATIVE = Layout(schema=3, limit=160)
SCORE_NATIVE = Layout(schema=6, limit=160)


@dataclass(frozen=True, eq=False)
class MetricDef:
    """One metric: OpenTelemetry instrument name, kind, UCUM unit, labels, buckets.

    Compared and hashed by identity (each is a module constant): recorders key their
    families by metric, and a field-by-field hash would cost a Python call per lookup."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    native: Layout | None = None  # native buckets next to the classic ones (below)

    @property
    def prometheus(self) -> str:
        """The Prometheus family name as exposed on /metrics (without _bucket/_sum/...)."""
        base = self.name.replace(".", "_") + _UNIT_SUFFIX.get(self.unit, "")
        if self.unit == "s2":
            base = self.name.replace(".", "_") + "_seconds_squared"
        return base + "_total" if self.kind is Kind.COUNTER else base

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        return tuple(label.replace(".", "_") for label in self.labels)

    def with_tenant(self) -> MetricDef:
        """This metric with the tenant label after the model's: its series are (operation,
        model, tenant, the rest). A copy (compared by identity): the sink makes one per
        family the operator chose to label by tenant."""
        labels = self.labels
        at = labels.index(MODEL) + 1 if MODEL in labels else len(labels)
        return dataclasses.replace(self, labels=(*labels[:at], TENANT, *labels[at:]))


TTFT = MetricDef(
    "gen_ai.server.time_to_first_token", Kind.HISTOGRAM, "s",
    "Time from the request reaching the sidecar to the first output token relayed.",
    _GENAI, TTFT_BUCKETS, LATENCY_NATIVE,
)  # fmt: skip
TPOT = MetricDef(
    "gen_ai.server.time_per_output_token", Kind.HISTOGRAM, "s",
    "Per request: (last token time - first token time) / (output tokens - 1).",
    _GENAI, LATENCY_BUCKETS, LATENCY_NATIVE,
)  # fmt: skip
DURATION = MetricDef(
    "gen_ai.server.request.duration", Kind.HISTOGRAM, "s",
    "Time from the request reaching the sidecar to the end of its response.",
    _GENAI, DURATION_BUCKETS, LATENCY_NATIVE,
)  # fmt: skip
TOKEN_USAGE = MetricDef(
    "gen_ai.client.token.usage", Kind.HISTOGRAM, "{token}",
    "Input and output tokens per request (engine usage when reported, else counted chunks).",
    (*_GENAI, TOKEN_TYPE), TOKEN_BUCKETS,
)  # fmt: skip
# The newest conventions' token usage (gen-ai-dev 1.42.0-dev): a histogram per direction
# instead of TOKEN_USAGE, and a counter per kind (cached and reasoning within their direction)
INPUT_TOKENS = MetricDef(
    "gen_ai.client.inference.operation.input_tokens", Kind.HISTOGRAM, "{token}",
    "Input tokens per request (engine usage when reported).",
    _GENAI, TOKEN_BUCKETS,
)  # fmt: skip
OUTPUT_TOKENS = MetricDef(
    "gen_ai.client.inference.operation.output_tokens", Kind.HISTOGRAM, "{token}",
    "Output tokens per request (engine usage when reported, else counted chunks).",
    _GENAI, TOKEN_BUCKETS,
)  # fmt: skip
USAGE_INPUT = MetricDef(
    "gen_ai.client.inference.usage.input_tokens", Kind.COUNTER, "{token}",
    "Input tokens, cached ones included.",
    (*_GENAI, MODALITY),
)  # fmt: skip
USAGE_OUTPUT = MetricDef(
    "gen_ai.client.inference.usage.output_tokens", Kind.COUNTER, "{token}",
    "Output tokens, reasoning ones included.",
    (*_GENAI, MODALITY),
)  # fmt: skip
USAGE_CACHE_READ = MetricDef(
    "gen_ai.client.inference.usage.cache_read.input_tokens", Kind.COUNTER, "{token}",
    "Input tokens read from the engine's prompt cache, as its usage reports them.",
    (*_GENAI, MODALITY),
)  # fmt: skip
USAGE_REASONING = MetricDef(
    "gen_ai.client.inference.usage.reasoning.output_tokens", Kind.COUNTER, "{token}",
    "Output tokens spent reasoning, as the engine's usage reports them.",
    (*_GENAI, MODALITY),
)  # fmt: skip
# a request's token counts by type (``mapping.RequestMapping``) into the newest usage counters
USAGE_BY_TYPE = {
    "input": USAGE_INPUT, "output": USAGE_OUTPUT, "cached_input": USAGE_CACHE_READ,
    "reasoning": USAGE_REASONING,
}  # fmt: skip
LATEST_USAGE = (INPUT_TOKENS, OUTPUT_TOKENS, USAGE_INPUT, USAGE_OUTPUT, USAGE_CACHE_READ,
                USAGE_REASONING)  # fmt: skip
ITL = MetricDef(
    "llmobs.inter_token_latency", Kind.TOKEN_HISTOGRAM, "s",
    "Gap between output chunks divided among the chunk's tokens, observed once per token.",
    _OP_MODEL, LATENCY_BUCKETS, ITL_NATIVE,
)  # fmt: skip
ITL_SQUARES = MetricDef(
    "llmobs.inter_token_latency", Kind.COUNTER, "s2",
    "Sum of squared per-token ITLs: with the ITL histogram's _sum and _count, variance.",
    _OP_MODEL,
)  # fmt: skip
STALLS = MetricDef(
    "llmobs.stalls", Kind.COUNTER, "{stall}",
    "Gaps between output chunks >= stall factor x the request's median gap and >= min gap, "
    "by cause: prefill, preemption, engine_pause, client, unknown.",
    (*_OP_MODEL, CAUSE),
)  # fmt: skip
SMOOTHNESS = MetricDef(
    "llmobs.smoothness", Kind.HISTOGRAM, "1",
    "Per request 1/(1+CV^2) of per-token ITLs: 1 = perfectly steady, lower = stutter.",
    _OP_MODEL, SMOOTHNESS_BUCKETS, SCORE_NATIVE,
)  # fmt: skip
REQUESTS = MetricDef(
    "llmobs.requests", Kind.COUNTER, "{request}",
    "Proxied requests by outcome, HTTP status class of the response and finish reason.",
    (*_OP_MODEL, OUTCOME, STATUS_CLASS, FINISH_REASON),
)  # fmt: skip
TOKENS = MetricDef(
    "llmobs.tokens", Kind.COUNTER, "{token}",
    "Tokens by type (input, output, reasoning within output, cached_input within input) and "
    "by where the count came from (the engine's usage, or counted chunks).",
    (*_OP_MODEL, TOKEN_TYPE, TOKEN_SOURCE),
)  # fmt: skip
TTFT_PHASE = MetricDef(
    "llmobs.ttft.phase.duration", Kind.HISTOGRAM, "s",
    "Each request's TTFT in phases that sum to it: before_engine and other as the sidecar "
    "measures them; load, queue and prefill as the engine reports them, when it does.",
    (*_OP_MODEL, PHASE), TTFT_BUCKETS, LATENCY_NATIVE,
)  # fmt: skip
ENGINE_PROMPT_EVAL = MetricDef(
    "llmobs.engine.prompt_eval.duration", Kind.HISTOGRAM, "s",
    "Prefill time as the engine itself reports it (Ollama prompt_eval_duration, "
    "llama.cpp timings.prompt_ms).",
    _OP_MODEL, TTFT_BUCKETS,
)  # fmt: skip
ENGINE_LOAD = MetricDef(
    "llmobs.engine.load.duration", Kind.HISTOGRAM, "s",
    "Model load time the engine reports for the request (Ollama load_duration).",
    _OP_MODEL, TTFT_BUCKETS,
)  # fmt: skip
SLO_REQUESTS = MetricDef(
    "llmobs.slo.requests", Kind.COUNTER, "{request}",
    "Requests judged against their service-level objectives: good (every bound met) or bad "
    "(a bound missed, or failed as the user sees it); client disconnects and 4xx are in neither.",
    (*_OP_MODEL, VERDICT),
)  # fmt: skip
SLO_MISSES = MetricDef(
    "llmobs.slo.misses", Kind.COUNTER, "{request}",
    "Bad requests by the objective they missed (one request may miss several): ttft, tpot, "
    "max_gap, stall, duration, or error; and why: a TTFT miss by the phase that took most "
    "of it, a gap or stall miss by the cause of the longest stall, the rest none.",
    (*_OP_MODEL, OBJECTIVE, CAUSE),
)  # fmt: skip
SLO_OUTPUT_TOKENS = MetricDef(
    "llmobs.slo.output_tokens", Kind.COUNTER, "{token}",
    "Output tokens of judged requests by verdict: the good ones are the token goodput.",
    (*_OP_MODEL, VERDICT),
)  # fmt: skip
SLO_TARGET = MetricDef(
    "llmobs.slo.target", Kind.UPDOWN, "1",
    "The objective's target: the share of requests that should be good (per label set).",
    _OP_MODEL,
)  # fmt: skip
SLO_WINDOW = MetricDef(
    "llmobs.slo.window", Kind.UPDOWN, "s",
    "The window the objective's target is measured over (per label set).",
    _OP_MODEL,
)  # fmt: skip
COST = MetricDef(
    "llmobs.cost", Kind.COUNTER, "1",
    "What requests' tokens cost at the price file's prices (input, cached input, output, "
    "reasoning), in its currency, by verdict (good, bad, none: not judged).",
    (*_OP_MODEL, VERDICT, CURRENCY),
)  # fmt: skip
ACTIVE = MetricDef(
    "llmobs.requests.active", Kind.UPDOWN, "{request}",
    "Requests in flight through the sidecar (streaming or not).",
)  # fmt: skip
QUEUE_DEPTH = MetricDef(
    "llmobs.prefill.queue_depth", Kind.UPDOWN, "{request}",
    "Requests forwarded upstream that have not produced their first token yet.",
)  # fmt: skip
MALFORMED = MetricDef(
    "llmobs.stream.malformed_events", Kind.COUNTER, "{event}",
    "Stream events that could not be parsed (relayed unchanged, not timed).",
)  # fmt: skip
OBSERVER_ERRORS = MetricDef(
    "llmobs.observer.errors", Kind.COUNTER, "{error}",
    "Internal errors while observing a request; the relay carried on.",
)  # fmt: skip

SPANS_DROPPED = MetricDef(
    "llmobs.spans.dropped", Kind.COUNTER, "{span}",
    "Spans dropped because the trace export queue was full (exported only when tracing is on).",
)  # fmt: skip

# Transports (llmobs/wire): TLS on the proxy port and to the engine. See docs/deploy.md.
RESULT = "result"  # how a handshake or a reload ended: a closed set (wire.accept.RESULTS)
CERTIFICATE = "certificate"  # serving (the listener's) or client (shown to the engine)

TLS_HANDSHAKES = MetricDef(
    "llmobs.tls.handshakes", Kind.COUNTER, "{handshake}",
    "TLS handshakes on the proxy port, by result: ok, timeout, closed, no_certificate, "
    "bad_certificate, plaintext, protocol, error.",
    (RESULT,),
)  # fmt: skip
TLS_RELOADS = MetricDef(
    "llmobs.tls.certificate.reloads", Kind.COUNTER, "{reload}",
    "Changed certificate files read again: ok (the new certificate is in use) or error (the "
    "old one stays; the log says which file and why).",
    (CERTIFICATE, RESULT),
)  # fmt: skip
TLS_EXPIRY = MetricDef(
    "llmobs.tls.certificate.expiration_timestamp", Kind.GAUGE, "s",
    "When the certificate in use expires (seconds since the epoch); minus time(): the "
    "seconds left.",
    (CERTIFICATE,),
)  # fmt: skip

# WebSocket sessions (llmobs/relay/upgrade.py) and realtime turns (llmobs/observe/realtime.py):
# families of their own, not the requests' (a session is no request: its duration is minutes,
# its first delta follows a commit, not the request's arrival). See docs/metrics.md.
API = "api"  # realtime (a /realtime path) or websocket (any other)
SOURCE = "source"  # who sent a message: client or engine
SESSION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

WS_SESSIONS = MetricDef(
    "llmobs.websocket.sessions", Kind.COUNTER, "{session}",
    "WebSocket sessions relayed, by how they ended: ok, client_disconnect, upstream_error, "
    "idle_timeout, too_large, client_timeout, shutdown.",
    (API, MODEL, OUTCOME),
)  # fmt: skip
WS_ACTIVE = MetricDef(
    "llmobs.websocket.sessions.active", Kind.UPDOWN, "{session}",
    "WebSocket sessions open now.",
    (API,),
)  # fmt: skip
WS_DURATION = MetricDef(
    "llmobs.websocket.session.duration", Kind.HISTOGRAM, "s",
    "From the engine's 101 to the session's end.",
    (API, MODEL, OUTCOME), SESSION_BUCKETS,
)  # fmt: skip
WS_MESSAGES = MetricDef(
    "llmobs.websocket.messages", Kind.COUNTER, "{message}",
    "WebSocket messages relayed (control frames included), by who sent them.",
    (API, SOURCE),
)  # fmt: skip
REALTIME_FIRST_DELTA = MetricDef(
    "llmobs.realtime.time_to_first_delta", Kind.HISTOGRAM, "s",
    "From a committed input (input_audio_buffer.commit, response.create) to the first delta "
    "of its answer: a realtime turn's time to first token.",
    (MODEL,), TTFT_BUCKETS,
)  # fmt: skip
REALTIME_DELTA_GAP = MetricDef(
    "llmobs.realtime.delta_gap", Kind.HISTOGRAM, "s",
    "Time between consecutive deltas of one realtime turn: its inter-token latency.",
    (MODEL,), LATENCY_BUCKETS,
)  # fmt: skip
REALTIME_TURNS = MetricDef(
    "llmobs.realtime.turns", Kind.COUNTER, "{turn}",
    "Realtime turns (a committed input and its answer), by how they ended: done, error, cut "
    "(the session ended first).",
    (MODEL, OUTCOME),
)  # fmt: skip
# Disaggregated prefill and decode (llmobs/observe/disagg.py): a leg is no user's request, so
# legs have families of their own; the users' disaggregated requests are in the request
# families (their TTFT phases: remote_prefill, kv_transfer, first_decode) and counted here by
# role too. See docs/metrics.md.
PD_ROLE = "pd_role"  # whole, disaggregated, prefill_leg, decode_leg, local_leg
RESULT = "result"  # how a disaggregated request's join with its decode leg ended
PD_REQUESTS = MetricDef(
    "llmobs.pd.requests", Kind.COUNTER, "{request}",
    "Requests with a part in disaggregated prefill and decode, by role (disaggregated: a "
    "user's request whose prefill is remote; prefill_leg, decode_leg, local_leg: legs, "
    "never counted as users' requests) and outcome.",
    (PD_ROLE, OUTCOME),
)  # fmt: skip
PD_LEG_DURATION = MetricDef(
    "llmobs.pd.leg.duration", Kind.HISTOGRAM, "s",
    "A leg's whole time, arrival to its answer's end (a prefill leg: its prefill's round "
    "trip as the prefill pod sees it).",
    (PD_ROLE, OUTCOME), TTFT_BUCKETS,
)  # fmt: skip
PD_LEG_PHASE = MetricDef(
    "llmobs.pd.leg.phase.duration", Kind.HISTOGRAM, "s",
    "A leg's time in phases that sum to it: a prefill leg's answer (before_engine, queue, "
    "prefill, other), a decode leg's time to its first token (before_engine, kv_transfer: the "
    "wait for the KV cache and a place in the batch, first_decode, other); reported phases "
    "only when the engine reports them.",
    (PD_ROLE, PHASE), TTFT_BUCKETS,
)  # fmt: skip
PD_JOINS = MetricDef(
    "llmobs.pd.joins", Kind.COUNTER, "{join}",
    "Disaggregated requests and their decode legs in one process: joined (the request found "
    "its leg), no_decode_leg (it ended without one), orphan_leg (a leg no request took).",
    (RESULT,),
)  # fmt: skip
PD_METRICS: tuple[MetricDef, ...] = (PD_REQUESTS, PD_LEG_DURATION, PD_LEG_PHASE, PD_JOINS)

# The API and transport each request spoke (llmobs/export/metrics/apis.py): an HTTP API's or
# an engine's gRPC one; the request families above hold them all alike. See docs/metrics.md.
TRANSPORT = "transport"  # http (HTTP/1.1 or HTTP/2) or grpc
GRPC_STATUS = "rpc_grpc_status_code"  # a gRPC call's status code (0-16), or none
API_REQUESTS = MetricDef(
    "llmobs.api.requests", Kind.COUNTER, "{request}",
    "Requests by the API they spoke (openai, anthropic, ollama, tgi, triton, openai-responses, "
    "vllm-grpc, sglang-grpc, trtllm-grpc, triton-grpc; grpc: another gRPC method; none), "
    "transport (http or grpc), "
    "outcome and gRPC status code (none for HTTP).",
    (API, TRANSPORT, OUTCOME, GRPC_STATUS),
)  # fmt: skip
API_METRICS: tuple[MetricDef, ...] = (API_REQUESTS,)

# Saturation (llmobs/observe/saturation.py, slo.latency_ratio): what an autoscaler may scale
# on, read by the recording rules (docs/metrics.md, "Saturation").
RATIO_BUCKETS = (
    0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.25, 1.5, 2.0,
    3.0, 5.0, 10.0,
)  # fmt: skip
PREFILL_BACKLOG = MetricDef(
    "llmobs.prefill.backlog", Kind.GAUGE, "s",
    "Seconds of prefill the prompts waiting for their first token will take, at the pace the "
    "engine has shown (fitted to its services; no throughput set by hand), by P/D role. "
    "Absent while prompts wait and no service was seen yet.",
    (PD_ROLE,),
)  # fmt: skip
PREFILL_BACKLOG_TOKENS = MetricDef(
    "llmobs.prefill.backlog_tokens", Kind.GAUGE, "{token}",
    "Prompt tokens waiting for their first token, estimated from their bytes (fitted to the "
    "usage the engine reports), by P/D role.",
    (PD_ROLE,),
)  # fmt: skip
PREFILL_BACKLOG_REQUESTS = MetricDef(
    "llmobs.prefill.backlog_requests", Kind.GAUGE, "{request}",
    "Requests waiting for their first token (a prefill leg: for its answer), by P/D role.",
    (PD_ROLE,),
)  # fmt: skip
PREFILL_BUSY = MetricDef(
    "llmobs.prefill.busy", Kind.COUNTER, "s",
    "Time with a prompt waiting for its first token, by P/D role: its rate is the share of "
    "time the engine's prefill is behind.",
    (PD_ROLE,),
)  # fmt: skip
SLO_LATENCY_RATIO = MetricDef(
    "llmobs.slo.latency_ratio", Kind.HISTOGRAM, "1",
    "Each judged request's latency against its own objective: the larger of TTFT over its "
    "TTFT bound and TPOT over its TPOT bound (1: at the bound). Requests of every model and "
    "tenant on one scale; observed only where a TTFT or TPOT bound applies.",
    _OP_MODEL, RATIO_BUCKETS, LATENCY_NATIVE,
)  # fmt: skip
SLO_BOUND = MetricDef(
    "llmobs.slo.bound", Kind.UPDOWN, "s",
    "The objective's bound on each request (per label set): ttft, tpot, max_gap, duration, "
    "those set.",
    (*_OP_MODEL, OBJECTIVE),
)  # fmt: skip
SATURATION_METRICS: tuple[MetricDef, ...] = (
    PREFILL_BACKLOG, PREFILL_BACKLOG_TOKENS, PREFILL_BACKLOG_REQUESTS, PREFILL_BUSY,
)  # fmt: skip

SESSION_METRICS: tuple[MetricDef, ...] = (
    WS_SESSIONS, WS_ACTIVE, WS_DURATION, WS_MESSAGES, REALTIME_FIRST_DELTA, REALTIME_DELTA_GAP,
    REALTIME_TURNS,
)  # fmt: skip
TRANSPORT_METRICS: tuple[MetricDef, ...] = (TLS_HANDSHAKES, TLS_RELOADS, TLS_EXPIRY)

# Collectors (llmobs/collectors): polled in the background, exported as observable
# instruments that read the last snapshot at scrape time. See docs/gpu.md.
COLLECTOR = "collector"
GPU_LABELS = ("gpu", "uuid", "name")
BANDWIDTH_SOURCE = "source"
ENGINE = "engine"
BASE_MODEL = "base_model"  # the model a LoRA adapter was trained on (the engine's /v1/models)

COLLECTOR_UP = MetricDef(
    "llmobs.collector.up", Kind.GAUGE, "1",
    "1 when the collector's last poll read something, 0 when it is down (no GPU, no engine "
    "metrics, an error).",
    (COLLECTOR,),
)  # fmt: skip
COLLECTOR_DURATION = MetricDef(
    "llmobs.collector.scrape.duration", Kind.GAUGE, "s",
    "How long the collector's last poll took.",
    (COLLECTOR,),
)  # fmt: skip
COLLECTOR_ERRORS = MetricDef(
    "llmobs.collector.errors", Kind.COUNTER, "{error}",
    "Unexpected failures of a collector: failed polls, and reads of one GPU or one field that "
    "failed while the others went on. An absent device or engine is not an error.",
    (COLLECTOR,),
)  # fmt: skip
GPU_MEMORY_USED = MetricDef(
    "llmobs.gpu.memory.used", Kind.GAUGE, "By", "GPU memory in use (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_FREE = MetricDef(
    "llmobs.gpu.memory.free", Kind.GAUGE, "By", "GPU memory free (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_TOTAL = MetricDef(
    "llmobs.gpu.memory.total", Kind.GAUGE, "By", "GPU memory in total (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_RESERVED = MetricDef(
    "llmobs.gpu.memory.reserved", Kind.GAUGE, "By",
    "GPU memory reserved by the driver and firmware (NVML memory info v2).", GPU_LABELS,
)  # fmt: skip
GPU_UTILIZATION = MetricDef(
    "llmobs.gpu.utilization", Kind.GAUGE, "1",
    "Fraction of the last sample period in which a kernel ran on the GPU (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_CONTROLLER = MetricDef(
    "llmobs.gpu.memory_controller.utilization", Kind.GAUGE, "1",
    "Fraction of the last sample period in which device memory was read or written (NVML).",
    GPU_LABELS,
)  # fmt: skip
GPU_BANDWIDTH_UTILIZATION = MetricDef(
    "llmobs.gpu.memory.bandwidth.utilization", Kind.GAUGE, "1",
    "DRAM bandwidth used / peak: NVML GPM DRAM_BW_UTIL (source=gpm, Hopper and newer), else "
    "the memory-controller busy ratio (source=mem_util, an upper bound).",
    (*GPU_LABELS, BANDWIDTH_SOURCE),
)  # fmt: skip
GPU_BANDWIDTH = MetricDef(
    "llmobs.gpu.memory.bandwidth", Kind.GAUGE, "By/s",
    "Achieved DRAM bandwidth: the bandwidth utilization x the peak bandwidth.",
    (*GPU_LABELS, BANDWIDTH_SOURCE),
)  # fmt: skip
GPU_BANDWIDTH_PEAK = MetricDef(
    "llmobs.gpu.memory.bandwidth.peak", Kind.GAUGE, "By/s",
    "Peak DRAM bandwidth: max memory clock x bus width x 2 (NVML), or --gpu-peak-bandwidth.",
    GPU_LABELS,
)  # fmt: skip
GPU_POWER = MetricDef(
    "llmobs.gpu.power", Kind.GAUGE, "W", "Power draw (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_TEMPERATURE = MetricDef(
    "llmobs.gpu.temperature", Kind.GAUGE, "Cel", "GPU die temperature (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_CLOCK_SM = MetricDef(
    "llmobs.gpu.clock.sm", Kind.GAUGE, "Hz", "Current SM clock (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_CLOCK_MEMORY = MetricDef(
    "llmobs.gpu.clock.memory", Kind.GAUGE, "Hz", "Current memory clock (NVML).", GPU_LABELS,
)  # fmt: skip
ENGINE_WAITING = MetricDef(
    "llmobs.engine.requests.waiting", Kind.GAUGE, "{request}",
    "Requests waiting in the engine's queue, from the engine's own /metrics.",
    (ENGINE,),
)  # fmt: skip
ENGINE_RUNNING = MetricDef(
    "llmobs.engine.requests.running", Kind.GAUGE, "{request}",
    "Requests in the engine's running batch, from the engine's own /metrics.",
    (ENGINE,),
)  # fmt: skip
ENGINE_PREEMPTIONS = MetricDef(
    "llmobs.engine.preemptions", Kind.COUNTER, "{request}",
    "Requests the engine preempted (the KV cache full), from its own /metrics: vLLM's "
    "num_preemptions, SGLang's retracted requests.",
    (ENGINE,),
)  # fmt: skip
ENGINE_PREFIX_HITS = MetricDef(
    "llmobs.engine.prefix_cache.hits", Kind.COUNTER, "{token}",
    "Prompt tokens found in the engine's prefix cache (vLLM's prefix_cache_hits).",
    (ENGINE,),
)  # fmt: skip
ENGINE_PREFIX_QUERIES = MetricDef(
    "llmobs.engine.prefix_cache.queries", Kind.COUNTER, "{token}",
    "Prompt tokens looked up in the engine's prefix cache (vLLM's prefix_cache_queries).",
    (ENGINE,),
)  # fmt: skip
ENGINE_PREFIX_RATIO = MetricDef(
    "llmobs.engine.prefix_cache.hit_ratio", Kind.GAUGE, "1",
    "The prefix cache's hit ratio where the engine exports only a ratio (SGLang's "
    "cache_hit_rate); elsewhere rate(hits) / rate(queries).",
    (ENGINE,),
)  # fmt: skip
ENGINE_SPEC_ACCEPTED = MetricDef(
    "llmobs.engine.spec_decode.accepted_tokens", Kind.COUNTER, "{token}",
    "Draft tokens the target model accepted in speculative decoding (vLLM's "
    "spec_decode_num_accepted_tokens).",
    (ENGINE,),
)  # fmt: skip
ENGINE_SPEC_DRAFTED = MetricDef(
    "llmobs.engine.spec_decode.draft_tokens", Kind.COUNTER, "{token}",
    "Draft tokens proposed in speculative decoding (vLLM's spec_decode_num_draft_tokens): "
    "the acceptance rate is rate(accepted) / rate(draft).",
    (ENGINE,),
)  # fmt: skip
MODEL_INFO = MetricDef(
    "llmobs.model.info", Kind.GAUGE, "1",
    "1 for each LoRA adapter the engine serves (its /v1/models), with its base model: join "
    "on gen_ai_request_model to aggregate adapters by base_model.",
    (MODEL, BASE_MODEL),
)  # fmt: skip
ENGINE_KV_CACHE = MetricDef(
    "llmobs.engine.kv_cache.usage", Kind.GAUGE, "1",
    "Fraction of the engine's KV cache in use (0-1), from the engine's own /metrics.",
    (ENGINE,),
)  # fmt: skip
MBU = MetricDef(
    "llmobs.mbu", Kind.GAUGE, "1",
    "Model bandwidth utilization of decode: (weight + KV-cache bytes read per step) / TPOT / "
    "peak bandwidth, over the last minute of streamed requests.",
    (MODEL,),
)  # fmt: skip
MFU = MetricDef(
    "llmobs.mfu", Kind.GAUGE, "1",
    "Model FLOPs utilization of prefill: 2 x params x prompt tokens / prefill time / peak "
    "FLOP/s, over the last minute (prefill time: TTFT unless the engine reports it).",
    (MODEL,),
)  # fmt: skip

# The sidecar's own cost and build, next to the traffic it carries: prometheus_client's
# process and platform collectors and its GC collector (their standard names), and ours.
PROCESS_CPU = MetricDef(
    "process.cpu", Kind.COUNTER, "s", "Total user and system CPU time spent in seconds."
)
PROCESS_RSS = MetricDef(
    "process.resident_memory", Kind.GAUGE, "By", "Resident memory size in bytes."
)
PROCESS_VMS = MetricDef("process.virtual_memory", Kind.GAUGE, "By", "Virtual memory size in bytes.")
PROCESS_FDS = MetricDef("process.open_fds", Kind.GAUGE, "{fd}", "Number of open file descriptors.")
PROCESS_MAX_FDS = MetricDef(
    "process.max_fds", Kind.GAUGE, "{fd}", "Maximum number of open file descriptors."
)
PROCESS_START = MetricDef(
    "process.start_time", Kind.GAUGE, "s", "Start time of the process since unix epoch in seconds."
)
PYTHON_INFO = MetricDef(
    "python.info", Kind.GAUGE, "1", "Python platform information.",
    ("implementation", "major", "minor", "patchlevel", "version"),
)  # fmt: skip
GC_COLLECTED = MetricDef(
    "python.gc.objects.collected", Kind.COUNTER, "{object}",
    "Objects collected during gc.", ("generation",),
)  # fmt: skip
GC_UNCOLLECTABLE = MetricDef(
    "python.gc.objects.uncollectable", Kind.COUNTER, "{object}",
    "Uncollectable objects found during GC.", ("generation",),
)  # fmt: skip
GC_COLLECTIONS = MetricDef(
    "python.gc.collections", Kind.COUNTER, "{collection}",
    "Number of times this generation was collected.", ("generation",),
)  # fmt: skip
BUILD_INFO = MetricDef(
    "llmobs.build.info", Kind.GAUGE, "1",
    "Always 1: the llmobs version, Python version, event loop and JSON parser this sidecar "
    "runs with.",
    ("version", "python", "event_loop", "json"),
)  # fmt: skip
PROCESS_METRICS: tuple[MetricDef, ...] = (
    PROCESS_CPU, PROCESS_RSS, PROCESS_VMS, PROCESS_FDS, PROCESS_MAX_FDS, PROCESS_START,
    PYTHON_INFO, GC_COLLECTED, GC_UNCOLLECTABLE, GC_COLLECTIONS, BUILD_INFO,
)  # fmt: skip

COLLECTOR_METRICS: tuple[MetricDef, ...] = (
    COLLECTOR_UP, COLLECTOR_DURATION, COLLECTOR_ERRORS, GPU_MEMORY_USED, GPU_MEMORY_FREE,
    GPU_MEMORY_TOTAL, GPU_MEMORY_RESERVED, GPU_UTILIZATION, GPU_MEMORY_CONTROLLER,
    GPU_BANDWIDTH_UTILIZATION, GPU_BANDWIDTH, GPU_BANDWIDTH_PEAK, GPU_POWER, GPU_TEMPERATURE,
    GPU_CLOCK_SM, GPU_CLOCK_MEMORY, ENGINE_WAITING, ENGINE_RUNNING, ENGINE_KV_CACHE, MODEL_INFO,
    ENGINE_PREEMPTIONS, ENGINE_PREFIX_HITS, ENGINE_PREFIX_QUERIES, ENGINE_PREFIX_RATIO,
    ENGINE_SPEC_ACCEPTED, ENGINE_SPEC_DRAFTED, MBU, MFU,
)  # fmt: skip

CATALOGUE: tuple[MetricDef, ...] = (
    TTFT, TTFT_PHASE, TPOT, DURATION, TOKEN_USAGE, *LATEST_USAGE, ITL, ITL_SQUARES, STALLS,
    SMOOTHNESS, REQUESTS, TOKENS, ENGINE_PROMPT_EVAL, ENGINE_LOAD, ACTIVE, QUEUE_DEPTH, MALFORMED,
    OBSERVER_ERRORS, SPANS_DROPPED, SLO_REQUESTS, SLO_MISSES, SLO_OUTPUT_TOKENS, SLO_TARGET,
    SLO_WINDOW, SLO_BOUND, SLO_LATENCY_RATIO, COST, *TRANSPORT_METRICS, *SESSION_METRICS,
    *PD_METRICS, *API_METRICS, *SATURATION_METRICS, *COLLECTOR_METRICS,
    *PROCESS_METRICS,
)  # fmt: skip


# The request-level families, as /metrics lists them (``sink.MetricsSink`` makes one family of
# each, ``otel.OtelMetrics`` one instrument of each when metrics are pushed over OTLP).
REQUEST_METRICS: tuple[MetricDef, ...] = (
    ACTIVE, QUEUE_DEPTH, OBSERVER_ERRORS, MALFORMED, REQUESTS, DURATION, TTFT, TTFT_PHASE, TPOT,
    SMOOTHNESS, TOKEN_USAGE, TOKENS, STALLS, ENGINE_PROMPT_EVAL, ENGINE_LOAD, ITL, ITL_SQUARES,
    SLO_REQUESTS, SLO_MISSES, SLO_OUTPUT_TOKENS, SLO_TARGET, SLO_WINDOW, SLO_BOUND,
    SLO_LATENCY_RATIO, COST,
)  # fmt: skip


def request_metrics(latest: bool = False) -> tuple[MetricDef, ...]:
    """The request-level families, as /metrics lists them: with ``latest`` (the newest GenAI
    conventions, ``config.otel``) the token usage histogram replaced by ``LATEST_USAGE``."""
    if not latest:
        return REQUEST_METRICS
    at = REQUEST_METRICS.index(TOKEN_USAGE)
    return (*REQUEST_METRICS[:at], *LATEST_USAGE, *REQUEST_METRICS[at + 1 :])


# The histograms whose classic buckets ``--buckets`` can set (``config.buckets.FAMILIES``)
BUCKET_METRICS: dict[str, MetricDef] = dict(
    zip(BUCKET_FAMILIES, (TTFT, TTFT_PHASE, TPOT, DURATION, ITL), strict=True)
)

# The request families a tenant label can be put on, by the names ``--tenant-metrics`` takes
# (``config.tenants.METRIC_NAMES``)
TENANT_METRICS: dict[str, tuple[MetricDef, ...]] = dict(zip(TENANT_METRIC_NAMES, (
    (REQUESTS,), (TTFT,), (TTFT_PHASE,), (TPOT,), (DURATION,), (ITL, ITL_SQUARES), (STALLS,),
    (SMOOTHNESS,), (TOKENS, TOKEN_USAGE, *LATEST_USAGE),
    (SLO_REQUESTS, SLO_MISSES, SLO_OUTPUT_TOKENS, SLO_TARGET, SLO_WINDOW, SLO_BOUND,
     SLO_LATENCY_RATIO), (COST,),
), strict=True))  # fmt: skip


def status_class(status: int) -> str:
    """'2xx' ... '5xx' for a status code; '0xx' when no response was produced."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "0xx"
