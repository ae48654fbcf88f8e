"""The request-level metrics as OpenTelemetry instruments, for an OTLP push.

A consumer of the request records (``OtelMetrics``), assembled only when metrics are pushed
over OTLP (``Telemetry.push_meter``): every request then pays the SDK's cost per record
(docs/benchmarks.md) on top of the Prometheus series (``sink``). The instruments are made from
the catalogue, one per request-level metric (the per-token ITL histogram is Prometheus only:
its windows are binned in bulk, which the SDK cannot take); the label-less series (requests
active and queued, the sidecar's own error counts) are read from the sink at each export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry.metrics import (
    CallbackOptions,
    Counter,
    Histogram,
    Meter,
    Observation,
    UpDownCounter,
)

from llmobs.config.objectives import Objectives
from llmobs.export.metrics.catalogue import (
    ACTIVE,
    CAUSE,
    COST,
    CURRENCY,
    DURATION,
    ENGINE_LOAD,
    ENGINE_PROMPT_EVAL,
    FINISH_REASON,
    INPUT_TOKENS,
    ITL,
    ITL_SQUARES,
    MALFORMED,
    MODALITY,
    MODEL,
    NO_MODALITY,
    OBJECTIVE,
    OBSERVER_ERRORS,
    OPERATION,
    OUTCOME,
    OUTPUT_TOKENS,
    PHASE,
    PROVIDER,
    QUEUE_DEPTH,
    REQUESTS,
    SLO_MISSES,
    SLO_OUTPUT_TOKENS,
    SLO_REQUESTS,
    SLO_TARGET,
    SLO_WINDOW,
    SMOOTHNESS,
    STALLS,
    STATUS_CLASS,
    TENANT,
    TOKEN_SOURCE,
    TOKEN_TYPE,
    TOKEN_USAGE,
    TOKENS,
    TPOT,
    TTFT,
    TTFT_PHASE,
    USAGE_BY_TYPE,
    VERDICT,
    Kind,
    MetricDef,
    request_metrics,
    status_class,
)
from llmobs.observe.causes import Stall, count_causes
from llmobs.observe.cost import cost_verdict
from llmobs.observe.provider import Provider
from llmobs.observe.record import RequestRecord
from llmobs.observe.slo import Verdict
from llmobs.observe.timing import RequestStats, TokenSource

Instrument = Counter | Histogram | UpDownCounter

_USAGE = TokenSource.USAGE.value
_LIVE = (ACTIVE, QUEUE_DEPTH, OBSERVER_ERRORS, MALFORMED)  # the sink's label-less series


def token_counts(s: RequestStats) -> list[tuple[str, str, int]]:
    """(token type, count source, tokens) of a request, in the order they are recorded."""
    # an enum's ``_value_`` is a plain attribute; ``.value`` is a Python-level property
    out = []
    if s.input_tokens is not None:
        out.append(("input", _USAGE, s.input_tokens))
    if s.output_tokens or s.ttft_s is not None:
        out.append(("output", s.token_source._value_, s.output_tokens))
    if s.reasoning_tokens:
        out.append(("reasoning", s.reasoning_source._value_, s.reasoning_tokens))
    if s.cached_tokens:
        out.append(("cached_input", _USAGE, s.cached_tokens))
    return out


def _instrument(meter: Meter, m: MetricDef) -> Instrument:
    if m.kind is Kind.HISTOGRAM:
        return meter.create_histogram(
            m.name, unit=m.unit, description=m.description,
            explicit_bucket_boundaries_advisory=list(m.buckets),
        )  # fmt: skip
    if m.kind is Kind.UPDOWN:
        return meter.create_up_down_counter(m.name, m.unit, m.description)
    return meter.create_counter(m.name, m.unit, m.description)


class OtelMetrics:
    """Each request's record into one instrument per request-level metric on ``meter`` (whose
    only reader pushes over OTLP); ``live`` gives the label-less series at each export, and
    ``objectives`` each label set's target and window, added once per label set."""

    def __init__(
        self,
        meter: Meter,
        objectives: Objectives,
        live: Callable[[], Mapping[MetricDef, float]],
        tenanted: frozenset[MetricDef] = frozenset(),
        currency: str = "",
        define: Callable[[MetricDef], MetricDef] | None = None,
        latest: bool = False,
        provider: Provider | None = None,
    ) -> None:
        """``tenanted``: the families labelled by tenant (the sink's); ``currency``: the price
        file's (a cost counter); ``define``: each metric as the sink defines it (its bucket
        bounds, the operator's if set); ``latest``: the newest GenAI conventions' token usage;
        ``provider``: the ``gen_ai.provider.name`` the GenAI families carry."""
        self._latest = latest
        self._provider = provider or Provider(engine_metrics=False)
        self._by_metric = {
            m: _instrument(meter, define(m) if define is not None else m)
            for m in request_metrics(latest)
            if m not in (ITL, ITL_SQUARES, *_LIVE)
        }
        self._tenanted = tenanted
        self._tenant = ""  # the tenant of the request being recorded
        self._currency = currency
        self._live = live
        for m in _LIVE:
            make = (
                meter.create_observable_up_down_counter
                if m.kind is Kind.UPDOWN
                else meter.create_observable_counter
            )
            make(m.name, [self._observe(m)], m.unit, m.description)
        self._objectives = objectives
        self._seen: set[tuple[str, str, str]] = set()  # label sets whose objective was added

    def _observe(self, metric: MetricDef) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._live()[metric])]

        return observe

    def consume(self, record: RequestRecord) -> None:
        """A finished request: its series, its verdict, its label set's objective once."""
        s, _, verdict, _, label, phases, stalls, tenant, cost = record
        op = s.operation
        self._tenant = tenant
        if (op, label, tenant) not in self._seen:
            self._seen.add((op, label, tenant))
            objective_set = self._objectives.for_request(op, label, tenant or None)
            attrs = {OPERATION: op, MODEL: label}
            self.add(SLO_TARGET, objective_set.target, attrs)
            self.add(SLO_WINDOW, objective_set.window, attrs)
        self.record_request(s, op, label, status_class(s.status), stalls)
        if phases is not None:
            for phase, ns in phases.present():
                self.record(TTFT_PHASE, ns / 1e9, {OPERATION: op, MODEL: label, PHASE: phase})
        if verdict is not None:
            self.record_verdict(verdict, s.output_tokens, op, label)
        if cost is not None and self._currency:
            judged = cost_verdict(verdict)
            attrs = {OPERATION: op, MODEL: label, VERDICT: judged, CURRENCY: self._currency}
            self.add(COST, cost, attrs)

    def add(
        self, metric: MetricDef, value: float, attributes: dict[str, str] | None = None
    ) -> None:
        """Add to a counter or an up-down counter (with the request's tenant, if its family
        is labelled by tenant)."""
        instrument = self._by_metric[metric]
        assert not isinstance(instrument, Histogram)
        if metric in self._tenanted and attributes is not None:
            attributes = {**attributes, TENANT: self._tenant}
        instrument.add(value, attributes)

    def record(self, metric: MetricDef, value: float, attributes: dict[str, str]) -> None:
        """Record into a histogram (with the request's tenant, as ``add``)."""
        instrument = self._by_metric[metric]
        assert isinstance(instrument, Histogram)
        if metric in self._tenanted:
            attributes = {**attributes, TENANT: self._tenant}
        instrument.record(value, attributes)

    def record_verdict(self, verdict: Verdict, output_tokens: int, op: str, model: str) -> None:
        """A judged request's verdict, its misses and its output tokens."""
        attrs = {OPERATION: op, MODEL: model}
        label = "good" if verdict.good else "bad"
        self.add(SLO_REQUESTS, 1, {**attrs, VERDICT: label})
        for objective, cause in zip(verdict.missed, verdict.causes, strict=True):
            self.add(SLO_MISSES, 1, {**attrs, OBJECTIVE: objective.value, CAUSE: cause})
        self.add(SLO_OUTPUT_TOKENS, output_tokens, {**attrs, VERDICT: label})

    def record_request(
        self, s: RequestStats, op: str, model: str, status: str, stalls: Sequence[Stall] = ()
    ) -> None:
        attrs = {OPERATION: op, MODEL: model}
        genai = {**attrs, PROVIDER: self._provider.name}  # the GenAI conventions' families'
        labels = {**attrs, OUTCOME: s.outcome.value, STATUS_CLASS: status}
        self.add(REQUESTS, 1, {**labels, FINISH_REASON: s.finish_reason})
        self.record(DURATION, s.duration_s, genai)
        for metric, value in (
            (TTFT, s.ttft_s),
            (TPOT, s.tpot_s),
            (SMOOTHNESS, s.smoothness),
            (ENGINE_PROMPT_EVAL, s.engine_prompt_eval_s),
            (ENGINE_LOAD, s.engine_load_s),
        ):
            if value is not None:
                self.record(metric, value, genai if PROVIDER in metric.labels else attrs)
        if s.stalls:
            for cause, count in count_causes(s.stalls, stalls):
                self.add(STALLS, count, {**attrs, CAUSE: cause._value_})
        for kind, source, count in token_counts(s):
            self._usage(kind, count, genai)
            self.add(TOKENS, count, {**attrs, TOKEN_TYPE: kind, TOKEN_SOURCE: source})

    def _usage(self, kind: str, count: int, genai: dict[str, str]) -> None:
        """A token count into the GenAI conventions' usage: v1.41's histogram by type, or the
        newest's histogram by direction and counter by kind."""
        if not self._latest:
            if kind in ("input", "output"):
                self.record(TOKEN_USAGE, count, {**genai, TOKEN_TYPE: kind})
            return
        if kind in ("input", "output"):
            self.record(INPUT_TOKENS if kind == "input" else OUTPUT_TOKENS, count, genai)
        self.add(USAGE_BY_TYPE[kind], count, {**genai, MODALITY: NO_MODALITY})
