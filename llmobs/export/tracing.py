"""Traces: one SERVER span per request, its queue+prefill and decode phases, its tokens.

Metrics say that P99 is bad; a trace says which request, which phase, which token. Spans are
recorded the way sinks are: the server span starts when the request arrives (its context must
go upstream, so that an engine that traces joins the trace), and everything else is written
when the request ends, from the finished record, with explicit timestamps. Nothing happens per
chunk. Names follow the OpenTelemetry GenAI conventions (span ``{operation} {model}``,
``gen_ai.*`` attributes); llmobs' own numbers are ``llmobs.*``.

Never prompt or completion text unless the operator opts in (``--capture-content``, then
truncated), never a request header but a plain ``X-Request-Id`` (the id a P/D router gives
both legs of a request): credentials cannot leak into a trace.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import NamedTuple

import numpy as np
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmobs.observe.dialects import Route
from llmobs.observe.disagg import PdRole
from llmobs.observe.provider import Provider
from llmobs.observe.record import RequestRecord, SpanTimes
from llmobs.observe.timing import Outcome
from llmobs.observe.window import FloatArray, TokenWindow

log = logging.getLogger("llmobs.tracing")

_TRACE_ID_MASK = (1 << 64) - 1  # the trace id's low 64 bits: random in every W3C trace id
_TRACE_ID_SPACE = 1 << 64


# GenAI semantic conventions (docs/tracing.md has each name's version)
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
REQUEST_STREAM = "gen_ai.request.stream"
MAX_TOKENS = "gen_ai.request.max_tokens"
TEMPERATURE = "gen_ai.request.temperature"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
# llmobs
TTFT = "llmobs.time_to_first_token"
TPOT = "llmobs.time_per_output_token"
ITL_P50 = "llmobs.itl.p50"
ITL_P99 = "llmobs.itl.p99"
ITL_MAX = "llmobs.itl.max"
SMOOTHNESS = "llmobs.smoothness"
STALLS = "llmobs.stalls"
TOKEN_SOURCE = "llmobs.token_count_source"
OUTCOME = "llmobs.outcome"
DIALECT = "llmobs.dialect"
SLO_VERDICT = "llmobs.slo.verdict"  # good or bad (absent: judged in no SLO series)
SLO_MISSED = "llmobs.slo.missed"  # the objectives a bad request missed
TENANT = "llmobs.tenant"  # the tenant's label (the operator's name for it, never a key)
COST = "llmobs.cost"  # what the request's tokens cost, in the price file's currency
SLO_CAUSES = "llmobs.slo.miss_causes"  # why, one per objective missed (``slo.miss_cause``)
EVENTS_CAP = "llmobs.token_events.cap"
EVENTS_DROPPED = "llmobs.token_events.dropped"
PREFILL_SPAN = "queue+prefill"
DECODE_SPAN = "decode"
# disaggregated prefill and decode (``observe.disagg``): the request's role, and a decode leg's
# wait for the KV cache as a span of its own under the leg's queue+prefill span
PD_ROLE = "llmobs.pd.role"
KV_TRANSFER_SPAN = "kv_transfer"
# the id a P/D router gives both legs of one request (llm-d, vLLM's toy proxy): the one
# request header a span carries, as the HTTP conventions name it, when it is a plain token
REQUEST_ID = "http.request.header.x-request-id"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
TOKEN_EVENT = "token"
STALL_EVENT = "llmobs.stall"  # one per stall on the decode span: its cause and gap
STALL_CAUSE = "llmobs.stall.cause"
STALL_GAP = "llmobs.stall.gap"


class RequestMeta(NamedTuple):
    """What the relay knows of a request when it arrives (no body, no header values kept).
    A named tuple (docs/architecture.md, "Records are named tuples")."""

    method: str
    path: str  # without the query string, which may carry keys
    headers: Mapping[str, str]  # read for trace context only
    wall_ns: int  # time.time_ns() at arrival, to put monotonic stamps on the wall clock


class Tracing:
    """Starts request traces; one per sidecar, built around an injected tracer.

    Writing a finished request's spans costs the SDK microseconds per token event, milliseconds
    for a long answer (docs/tracing.md), which must not land on the relay's event loop between
    other streams' tokens: it is handed to one worker thread through a bounded queue. When the
    queue is full the request's trace is dropped and counted, never waited for.
    """

    def __init__(
        self,
        tracer: Tracer,
        *,
        token_events: int = 256,
        token_spans: bool = False,
        capture_content: bool = False,
        server_address: str = "",
        server_port: int = 0,
        max_pending: int = 1024,
        on_drop: Callable[[int], None] = lambda n: None,
        good_ratio: float = 1.0,
        provider: Provider | None = None,
        latest: bool = False,
    ) -> None:
        """``provider``: the ``gen_ai.provider.name`` every span carries (read as each
        starts); ``latest``: the newest GenAI conventions (``gen_ai.request.stream`` only when
        the request streams)."""
        self.tracer = tracer
        self.provider = provider or Provider(engine_metrics=False)
        self.latest = latest
        # tail sampling: a good request's trace is kept when its trace id falls under this
        # bound (as TraceIdRatioBased draws, so every party keeps the same traces)
        self._keep_below = round(good_ratio * _TRACE_ID_SPACE)
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_pending)
        self._worker: threading.Thread | None = None
        self._on_drop = on_drop
        self.dropped = 0
        self.token_events = token_events
        self.token_spans = token_spans
        self.capture_content = capture_content
        self._server = (server_address, server_port)
        self._propagator = CompositePropagator(
            [TraceContextTextMapPropagator(), W3CBaggagePropagator()]
        )

    def start(self, route: Route, start_ns: int, meta: RequestMeta) -> RequestTrace:
        """Open the request's SERVER span, continuing the client's trace context."""
        parent = self._propagator.extract(meta.headers)
        span = self.tracer.start_span(
            route.operation,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=meta.wall_ns,
            attributes={
                OPERATION: route.operation,
                PROVIDER: self.provider.name,
                DIALECT: route.name,
                "http.request.method": meta.method,
                "url.path": meta.path,
                "server.address": self._server[0],
                "server.port": self._server[1],
            },
        )
        request_id = meta.headers.get("x-request-id")
        if request_id is not None and _REQUEST_ID.fullmatch(request_id):
            span.set_attribute(REQUEST_ID, [request_id])
        context = span.get_span_context()
        # kept whatever its verdict: a trace the client sampled, or every trace (ratio 1)
        keep = self._keep_below >= _TRACE_ID_SPACE or (
            trace.get_current_span(parent).get_span_context().trace_flags.sampled
        )
        keep = keep or (context.trace_id & _TRACE_ID_MASK) < self._keep_below
        return RequestTrace(
            self, span, trace.set_span_in_context(span, parent), start_ns, meta, keep
        )

    def inject(self, context: Context, carrier: MutableMapping[str, str]) -> None:
        self._propagator.inject(carrier, context=context)

    def extract(self, headers: Mapping[str, str]) -> Context:
        """The trace context a client sent (traceparent, baggage)."""
        return self._propagator.extract(headers)

    def defer(self, job: Callable[[], None], spans: int = 1) -> None:
        """Run ``job`` on the tracing thread; if the backlog is full, drop it and count the
        ``spans`` it would have written."""
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="llmobs-traces", daemon=True)
            self._worker.start()
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.dropped += spans
            self._on_drop(spans)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:
                log.exception("writing a trace failed")
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def drain(self) -> None:
        """Wait until every deferred trace is written (tests, shutdown)."""
        if self._worker is not None:
            self._jobs.join()

    def close(self) -> None:
        """Write what is pending, then stop the worker."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout=10)
            self._worker = None


class RequestTrace:
    """The trace of one request: inject its context upstream, write it when it ends."""

    __slots__ = ("_context", "_mono0", "_tracing", "_wall0", "keep", "span")

    def __init__(
        self,
        tracing: Tracing,
        span: Span,
        context: Context,
        start_ns: int,
        meta: RequestMeta,
        keep: bool = True,
    ) -> None:
        self._tracing = tracing
        # written even if the request turns out good (else only if bad: tail sampling)
        self.keep = keep
        self.span = span
        self._context = context
        self._mono0 = start_ns
        self._wall0 = meta.wall_ns

    def ids(self) -> tuple[str, str] | None:
        """The request span's trace and span ids as W3C writes them (hex), if it is recorded
        (else no trace will exist to point at)."""
        span = self.span
        if not span.is_recording():
            return None
        context = span.get_span_context()
        return format(context.trace_id, "032x"), format(context.span_id, "016x")

    def wall(self, t_ns: int) -> int:
        """A monotonic stamp of the relay on the wall clock spans use."""
        return self._wall0 + (t_ns - self._mono0)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Put this request's span context on the upstream request (traceparent, baggage)."""
        self._tracing.inject(self._context, headers)

    def finish(self, record: RequestRecord, times: SpanTimes, completion: str | None) -> None:
        """Write attributes, phases and token events (on the tracing thread); end the span.

        ``times`` = (forwarded, first token, last token, end) on the relay's monotonic clock;
        ``completion``: the output text, only with ``--capture-content`` (truncated).
        """
        verdict = record.verdict
        if not self.keep and (verdict is None or verdict.good):
            return  # sampled out: never ended, so no processor sees it
        decoded = times[1] is not None and times[2] is not None
        # the request, queue+prefill, decode if any, a decode leg's kv_transfer if reported
        spans = (3 if decoded else 2) + bool(_transfer_ns(record))
        self._tracing.defer(lambda: self._write(record, times, completion), spans)

    def _write(self, record: RequestRecord, times: SpanTimes, completion: str | None) -> None:
        span = self.span
        if not span.is_recording():  # not sampled: nothing to write
            span.end(end_time=self.wall(times[3]))
            return
        forwarded, first, last, end = times
        stats, windows = record.stats, record.windows
        model = stats.model
        span.update_name(f"{stats.operation} {model}" if model else stats.operation)
        span.set_attributes(_attributes(record, completion, self._tracing.latest))
        # as the request's metrics have it (found while it ran, if it was)
        span.set_attribute(PROVIDER, self._tracing.provider.name)
        if stats.outcome in (Outcome.UPSTREAM_ERROR, Outcome.UPSTREAM_TIMEOUT):
            span.set_status(Status(StatusCode.ERROR, stats.outcome.value))
            span.set_attribute("error.type", stats.outcome.value)
        tracer = self._tracing.tracer
        context = trace.set_span_in_context(span)
        prefill_start = forwarded if forwarded is not None else self._mono0
        prefill = tracer.start_span(
            PREFILL_SPAN, context=context, start_time=self.wall(prefill_start)
        )
        transfer_ns = _transfer_ns(record)
        if transfer_ns:
            transfer = tracer.start_span(
                KV_TRANSFER_SPAN, context=trace.set_span_in_context(prefill),
                start_time=self.wall(prefill_start),
            )  # fmt: skip
            transfer.end(end_time=self.wall(prefill_start + transfer_ns))
        prefill.end(end_time=self.wall(first if first is not None else end))
        if first is not None and last is not None:
            decode = tracer.start_span(DECODE_SPAN, context=context, start_time=self.wall(first))
            self._token_events(decode, windows[0] if windows else None)
            for stall in record.stalls:  # at its end: when the user saw the stream resume
                attributes = {STALL_CAUSE: stall.cause._value_, STALL_GAP: stall.gap_s}
                decode.add_event(STALL_EVENT, attributes, timestamp=self.wall(stall.end_ns))
            decode.end(end_time=self.wall(last))
        span.end(end_time=self.wall(end))

    def _token_events(self, decode: Span, window: TokenWindow | None) -> None:
        """One event per chunk on the decode span, capped; every stall is always kept."""
        cap = self._tracing.token_events
        decode.set_attribute(EVENTS_CAP, cap)
        if window is None or window.gaps.size == 0:
            decode.set_attribute(EVENTS_DROPPED, 0)
            return
        gaps, tokens, times = window.gaps, window.weights, window.times_ns[1:]
        threshold = window.stall_threshold
        stalls = gaps >= threshold if threshold is not None else np.zeros(gaps.size, bool)
        keep = stalls.copy()
        budget = max(cap - int(stalls.sum()), 0)
        keep[np.flatnonzero(~stalls)[:budget]] = True
        index = np.cumsum(tokens)  # output token index reached at each chunk
        chosen = np.flatnonzero(keep)
        decode.set_attribute(EVENTS_DROPPED, int(gaps.size - chosen.size))
        tracer = self._tracing.tracer
        parent = trace.set_span_in_context(decode)
        for i in chosen.tolist():
            attributes = {
                "llmobs.token.index": int(index[i]),
                "llmobs.token.gap": float(gaps[i]),
                "llmobs.token.count": int(tokens[i]),
                "llmobs.stall": bool(stalls[i]),
            }
            at = self.wall(int(times[i]))
            decode.add_event(TOKEN_EVENT, attributes, timestamp=at)
            if self._tracing.token_spans:
                child = tracer.start_span(
                    TOKEN_EVENT, context=parent, start_time=at - int(gaps[i] * 1e9),
                    attributes=attributes,
                )  # fmt: skip
                child.end(end_time=at)


def _transfer_ns(record: RequestRecord) -> int:
    """A decode leg's wait for the KV cache as its engine reported it (0: none, or no leg)."""
    phases = record.phases
    if record.pd is not PdRole.DECODE_LEG or phases is None:
        return 0
    return phases.kv_transfer_ns or 0


def _attributes(
    record: RequestRecord, completion: str | None, latest: bool = False
) -> dict[str, str | bool | int | float | Sequence[str]]:
    """A finished request's span attributes; ``latest``: as the newest GenAI conventions
    say (``gen_ai.request.stream`` set if and only if the request streams)."""
    stats, request = record.stats, record.request
    attrs: dict[str, str | bool | int | float | Sequence[str]] = {
        OUTPUT_TOKENS: stats.output_tokens,
        TOKEN_SOURCE: stats.token_source.value,
        OUTCOME: stats.outcome.value,
        STALLS: stats.stalls,
        FINISH_REASONS: list(stats.finish_reasons) or [stats.finish_reason],
        "http.response.status_code": stats.status,
    }
    optional: dict[str, str | int | float | None] = {
        REQUEST_MODEL: stats.model,
        RESPONSE_MODEL: stats.response_model,
        RESPONSE_ID: stats.response_id,
        INPUT_TOKENS: stats.input_tokens,
        TTFT: stats.ttft_s,
        TPOT: stats.tpot_s,
        SMOOTHNESS: stats.smoothness,
        MAX_TOKENS: request.max_tokens,
        TENANT: record.tenant or None,
        COST: record.cost,
        TEMPERATURE: request.temperature,
        INPUT_MESSAGES: request.prompt,
        OUTPUT_MESSAGES: completion,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    if record.pd is not PdRole.WHOLE:
        attrs[PD_ROLE] = record.pd._value_
    if stats.stream or not latest:
        attrs[REQUEST_STREAM] = stats.stream
    if stats.stream and stats.ttft_s is not None:
        attrs[TIME_TO_FIRST_CHUNK] = stats.ttft_s
    if stats.cached_tokens:
        attrs[CACHE_READ_TOKENS] = stats.cached_tokens
    if stats.reasoning_tokens:
        attrs[REASONING_TOKENS] = stats.reasoning_tokens
    if stats.grpc_status is not None:  # OpenTelemetry's RPC conventions, for a gRPC call
        attrs["rpc.system"] = "grpc"
        attrs["rpc.grpc.status_code"] = stats.grpc_status
    attrs.update(_judged(record))
    attrs.update(_itl(record.windows))
    return attrs


def _judged(record: RequestRecord) -> dict[str, str | float | Sequence[str]]:
    """The request's TTFT phases (seconds of each, and which the engine reported:
    docs/metrics.md) and its verdict, with what it missed and why."""
    attrs: dict[str, str | float | Sequence[str]] = {}
    phases = record.phases
    if phases is not None:
        for phase, ns in phases.present():
            attrs[f"llmobs.ttft.{phase._value_}"] = ns / 1e9
        attrs["llmobs.ttft.reported"] = [phase._value_ for phase in phases.reported]
    verdict = record.verdict
    if verdict is not None:
        attrs[SLO_VERDICT] = "good" if verdict.good else "bad"
        if verdict.missed:
            attrs[SLO_MISSED] = [objective.value for objective in verdict.missed]
            attrs[SLO_CAUSES] = list(verdict.causes)
    return attrs


def _itl(windows: Sequence[TokenWindow]) -> dict[str, float]:
    """The request's ITL quantiles and worst gap, from its last windows."""
    itl = [w.itl for w in windows if w.itl.size]
    if not itl:
        return {}
    values = np.concatenate(itl)
    weights = np.concatenate([w.weights for w in windows if w.itl.size])
    return {
        ITL_P50: weighted_quantile(values, weights, 0.5),
        ITL_P99: weighted_quantile(values, weights, 0.99),
        ITL_MAX: float(values.max()),
    }


def weighted_quantile(values: FloatArray, weights: FloatArray, q: float) -> float:
    """The ``q`` quantile of ``values`` each counted ``weights`` times (lower value at ties)."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    rank = q * cumulative[-1]
    return float(values[order][min(int(np.searchsorted(cumulative, rank)), values.size - 1)])
