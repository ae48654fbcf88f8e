"""The sink: finished requests and token windows into the catalogue's series.

Recording does not go through the OpenTelemetry SDK: its ``Histogram.record`` costs more than
a whole request's plain-Python recording, a request needs ten, and the SDK's Prometheus
exporter rebuilds every family at each scrape (docs/benchmarks.md has the figures).
Each series is a plain-Python accumulator (``series``) exposed by one prometheus_client
collector on the registry /metrics renders, with the exposition the exporter produced (names,
types, labels, buckets): a request costs a few microseconds. A request's series are bound
once per label set (``_LabelSet``, a ``HistogramRow``), so recording one is a few list updates
under one lock. The
per-token ITL histogram is binned a window at a time (``series.TokenHistogram``), with the
sum of squares that makes ITL variance aggregable across pods. When metrics are also pushed
over OTLP, another consumer of the same records does it (``otel.OtelMetrics``).

Labels come from bounded sets: the model's label is admitted once, in observation, from the
sink's ``BoundedLabel`` (so a client cannot explode the series count, and a new model takes a
slot only from a successful request); the sink labels by it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from llmobs.config.buckets import Buckets
from llmobs.config.objectives import Objectives, ObjectiveSet
from llmobs.config.tenants import Tenancy
from llmobs.export.metrics.catalogue import (
    ACTIVE,
    BUCKET_METRICS,
    COST,
    DURATION,
    ENGINE_LOAD,
    ENGINE_PROMPT_EVAL,
    INPUT_TOKENS,
    ITL,
    ITL_SQUARES,
    MALFORMED,
    NO_MODALITY,
    OBSERVER_ERRORS,
    OUTPUT_TOKENS,
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
    TENANT_METRICS,
    TOKEN_USAGE,
    TOKENS,
    TPOT,
    TTFT,
    TTFT_PHASE,
    USAGE_BY_TYPE,
    USAGE_INPUT,
    Kind,
    MetricDef,
    request_metrics,
    status_class,
)
from llmobs.export.metrics.otel import token_counts
from llmobs.export.metrics.series import (
    CounterFamily,
    HistogramFamily,
    HistogramRow,
    SeriesCollector,
    TokenHistogram,
)
from llmobs.observe.causes import STALL_CAUSES, count_causes
from llmobs.observe.cost import cost_verdict
from llmobs.observe.dialects import OPERATIONS
from llmobs.observe.labels import OTHER, UNKNOWN, BoundedLabel
from llmobs.observe.phases import Phase, TtftPhases
from llmobs.observe.provider import UNKNOWN as NO_PROVIDER
from llmobs.observe.record import RequestRecord, TraceRef
from llmobs.observe.slo import Verdict, judge, miss_causes
from llmobs.observe.timing import RequestStats
from llmobs.observe.window import TokenWindow

_STATUS_CLASSES = {status: status_class(status) for status in range(600)}
# The request histograms a label set binds, in the order ``record_request`` observes them
# (then the token usage histogram twice, input then output tokens: the newest conventions'
# histogram of each instead)
_OBSERVED = (DURATION, TTFT, TPOT, SMOOTHNESS, ENGINE_PROMPT_EVAL, ENGINE_LOAD)
_USAGE_TYPES = {"input": 0, "output": 1}  # their place after _OBSERVED's
# then the TTFT phase histogram once per phase, in this order (``TtftPhases``' fields')
_PHASES = (Phase.BEFORE_ENGINE, Phase.LOAD, Phase.QUEUE, Phase.PREFILL, Phase.OTHER)
_NO_PHASES = (None,) * len(_PHASES)


class _LabelSet:
    """The request series of one (operation, model, tenant) label set, bound once: recording
    a request then observes into a row it holds (``HistogramRow``), with no label tuple built
    and no dict lookup. Each family's series start with the label set's values, the tenant's
    among them where the family is labelled by tenant, then the provider's where the GenAI
    conventions require it (``prefix``)."""

    __slots__ = ("bad", "cost", "good", "itl", "key", "prefix", "requests", "row", "slo",
                 "stalls", "tokens", "usage")  # fmt: skip

    def __init__(
        self,
        key: tuple[str, str],
        tenant: str,
        tenanted: frozenset[MetricDef],
        provider: str = NO_PROVIDER,
    ) -> None:
        self.key = key  # (operation, model)
        full = (*key, tenant)

        def prefix(metric: MetricDef) -> tuple[str, ...]:
            values = full if metric in tenanted else key
            return (*values, provider) if PROVIDER in metric.labels else values

        self.requests, self.tokens, self.stalls = prefix(REQUESTS), prefix(TOKENS), prefix(STALLS)
        self.usage = (*prefix(USAGE_INPUT), NO_MODALITY)  # the newest usage counters' labels
        self.slo, self.cost, self.itl = prefix(SLO_REQUESTS), prefix(COST), prefix(ITL)
        self.good = (*self.slo, "good")  # the SLO series' label values, by verdict
        self.bad = (*self.slo, "bad")
        self.row: HistogramRow | None = None  # made by the sink, which holds the families
        self.prefix = prefix


class MetricsSink:
    """Records finished requests and token windows into the catalogue's request series.

    ``registry`` is the one /metrics renders (the sink registers its collector there; None:
    the caller does). ``models`` is the bounded set of model labels, which observation
    admits models to.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None,
        max_models: int,
        objectives: Objectives | None = None,
        clock: Callable[[], float] = time.time,
        tenancy: Tenancy | None = None,
        max_tenants: int = 32,
        currency: str = "",
        buckets: Buckets = (),
        latest: bool = False,
        provider: str = NO_PROVIDER,
    ) -> None:
        """``tenancy``: the tenants' rules (labels by tenant on the families it names);
        ``currency``: the price file's (a cost counter; "": no price file, no cost);
        ``buckets``: classic bucket bounds the operator set (``--buckets``); ``latest``: the
        newest GenAI conventions' token usage (``config.otel``); ``provider``: the
        ``gen_ai.provider.name`` value until ``set_provider``."""
        self.latest = latest
        self.provider = provider
        self._bounds = {BUCKET_METRICS[name]: bounds for name, bounds in buckets}
        self.models = BoundedLabel(max_models)
        tenancy = tenancy or Tenancy()
        self.tenants = BoundedLabel(max_tenants, tenancy.names) if tenancy.on else None
        self._tenanted = frozenset(
            m for name in tenancy.metrics for m in TENANT_METRICS[name]
        ) if tenancy.on else frozenset()  # fmt: skip
        self.currency = currency
        self._clock = clock  # unix seconds: when an exemplar was seen
        # what each request is judged by (the default: no latency bound, 99.9 % not failing)
        self.objectives = objectives or Objectives(ObjectiveSet())
        self._sets: dict[tuple[str, str, str], _LabelSet] = {}  # by (operation, model, tenant)
        self._itl = TokenHistogram(self.define(ITL), self.define(ITL_SQUARES))
        # every request series, by the catalogue's metric (readers: the live page's totals)
        self.families: dict[MetricDef, HistogramFamily | CounterFamily] = {}
        for metric in request_metrics(latest):
            if metric is COST and not currency:
                continue
            if metric is ITL:
                self.families[metric] = self._itl.histogram
            elif metric is ITL_SQUARES:
                self.families[metric] = self._itl.squares
            elif metric.kind is Kind.HISTOGRAM:
                self.families[metric] = HistogramFamily(self.define(metric))
            else:
                gauge = metric.kind is Kind.UPDOWN
                self.families[metric] = CounterFamily(self.define(metric), gauge=gauge)
        self._histograms = {
            m: f for m, f in self.families.items() if isinstance(f, HistogramFamily)
        }
        self._requests = self._counter(REQUESTS)
        self._tokens = self._counter(TOKENS)
        self._stalls = self._counter(STALLS)
        self._slo_requests = self._counter(SLO_REQUESTS)
        self._slo_misses = self._counter(SLO_MISSES)
        self._slo_tokens = self._counter(SLO_OUTPUT_TOKENS)
        self._cost = self._counter(COST) if currency else None
        # the label-less ones (gauges, and counters of the sidecar's own errors): zero-valued
        # series up front, so dashboards and alerts see 0 rather than no data
        self._active = self._counter(ACTIVE)
        self._queue = self._counter(QUEUE_DEPTH)
        self._errors = self._counter(OBSERVER_ERRORS)
        self._malformed = self._counter(MALFORMED)
        for family in (self._active, self._queue, self._errors, self._malformed):
            family.series[()] = 0
        self.collector = SeriesCollector(tuple(self.families.values()))
        self._lock = self.collector.lock
        # The closed label sets' series exist from the start, at 0: the first burst of errors
        # of a model not admitted (other), or of requests that name none (unknown), is an
        # increase a scrape can see, not a series born already counting them
        tenants = (UNKNOWN, OTHER) if self.tenants is not None else ("",)
        for operation in OPERATIONS:
            for model in (OTHER, UNKNOWN):
                for tenant in tenants:
                    self._label_set(operation, model, tenant)
        if registry is not None:
            registry.register(self.collector)

    def set_provider(self, provider: str) -> None:
        """The provider is known (``observe.provider``, once): every label set bound so far
        is bound again, so that later requests count under it; the series under the old value
        keep what they counted (and go stale)."""
        if provider == self.provider:
            return
        self.provider = provider
        keys = list(self._sets)
        self._sets.clear()
        for key in keys:
            self._label_set(*key)

    @property
    def tenanted(self) -> frozenset[MetricDef]:
        """The families labelled by tenant."""
        return self._tenanted

    def define(self, metric: MetricDef) -> MetricDef:
        """The metric as this sink exposes it: with the tenant label if labelled so, with
        the operator's bucket bounds if set."""
        bounds = self._bounds.get(metric)
        defined = metric if bounds is None else dataclasses.replace(metric, buckets=bounds)
        return defined.with_tenant() if metric in self._tenanted else defined

    def _counter(self, metric: MetricDef) -> CounterFamily:
        family = self.families[metric]
        assert isinstance(family, CounterFamily)
        return family

    def _label_set(self, operation: str, label: str, tenant: str = "") -> _LabelSet:
        """The series of a request's labels, bound on first use."""
        found = self._sets.get((operation, label, tenant))
        if found is None:
            found = self._new_label_set(operation, label, tenant)
            self._sets[(operation, label, tenant)] = found
        return found

    # The label-less series (requests active and queued, the sidecar's own error counts) are
    # added to without the lock: each is one number, written by the event loop alone, and a
    # scrape reads it old or new.

    def live(self) -> Mapping[MetricDef, float]:
        """The label-less series now (requests active and queued, the sidecar's own error
        counts): what an OTLP push reads at each export (``otel.OtelMetrics``)."""
        return {f.metric: f.series[()] for f in (self._active, self._queue, self._errors,
                                                 self._malformed)}  # fmt: skip

    def request_started(self) -> None:
        self._active.series[()] += 1

    def request_ended(self) -> None:
        self._active.series[()] += -1

    def queue_enter(self) -> None:
        self._queue.series[()] += 1

    def queue_leave(self) -> None:
        self._queue.series[()] += -1

    def observer_error(self) -> None:
        self._errors.series[()] += 1

    def malformed(self, count: int) -> None:
        if count:
            self._malformed.series[()] += count

    def labels(self, model: str | None, tenant: str | None, admit: bool) -> tuple[str, str]:
        """A request's model and tenant labels (the tenant's "" when tenants are not
        labelled); new values take a slot only when ``admit`` (a successful request)."""
        tenants = self.tenants  # (an empty BoundedLabel is falsy: compare with None)
        label = tenants.get(tenant, admit) if tenants is not None else ""
        return self.models.get(model, admit), label

    def answered(self, operation: str, model: str | None, tenant: str | None) -> None:
        """The engine answered a request (a 2xx or 3xx head): its model (and tenant) take
        their labels now, and their label set's series appear at 0 before the request is
        counted at its end, so that even its first requests are an increase to a scrape."""
        label, tenant_label = self.labels(model, tenant, True)
        if (operation, label, tenant_label) not in self._sets:
            self._label_set(operation, label, tenant_label)

    def record_tokens(
        self, operation: str, label: str, window: TokenWindow, tenant: str = ""
    ) -> None:
        """Add a window of ITLs taken mid-stream (a long stream's; the last windows go with
        the request's record) under the request's model (and tenant) label."""
        if window.size:
            key = self._label_set(operation, label, tenant).itl
            with self._lock:
                self._itl.record(key, window)

    def _new_label_set(self, operation: str, model: str, tenant: str) -> _LabelSet:
        labels = _LabelSet((operation, model), tenant, self._tenanted, self.provider)
        prefix = labels.prefix
        members: list[tuple[HistogramFamily, tuple[str, ...]]]
        members = [(self._histograms[metric], prefix(metric)) for metric in _OBSERVED]
        if self.latest:
            members += [(self._histograms[m], prefix(m)) for m in (INPUT_TOKENS, OUTPUT_TOKENS)]
        else:
            usage = self._histograms[TOKEN_USAGE]
            members += [(usage, (*prefix(TOKEN_USAGE), kind)) for kind in ("input", "output")]
        phases = self._histograms[TTFT_PHASE]
        members += [(phases, (*prefix(TTFT_PHASE), phase._value_)) for phase in _PHASES]
        labels.row = HistogramRow(members)
        with self._lock:  # at 0 from the start: rate() over a healthy model reads 0
            for cause in STALL_CAUSES:
                self._stalls.series.setdefault((*labels.stalls, cause._value_), 0)
        self._slo_series(labels, tenant)
        return labels

    def _slo_series(self, labels: _LabelSet, tenant: str) -> None:
        """A new label set's SLO series, at 0 (``rate()`` then reads 0, not "no data"), and its
        objective's target and window."""
        key = labels.slo
        objective_set = self.objectives.for_request(*labels.key, tenant or None)
        settings = ((SLO_TARGET, objective_set.target), (SLO_WINDOW, objective_set.window))
        with self._lock:
            for family in (self._slo_requests, self._slo_tokens):
                for verdict in (labels.good, labels.bad):
                    family.series.setdefault(verdict, 0)
            for objective in objective_set.objectives:
                for cause in miss_causes(objective):
                    self._slo_misses.series.setdefault((*key, objective.value, cause), 0)
            for metric, value in settings:
                self._counter(metric).series[key] = value

    def _record_tokens(self, labels: _LabelSet, s: RequestStats) -> list[int | None]:
        """The request's token counts into the counter by type and source; returns the
        input and output counts (None: not recorded) for the usage histogram."""
        usage: list[int | None] = [None, None]
        tokens, prefix = self._tokens, labels.tokens
        for kind, source, count in token_counts(s):
            index = _USAGE_TYPES.get(kind)
            if index is not None:
                usage[index] = count
            tokens.add((*prefix, kind, source), count)
            if self.latest:  # the newest conventions' counter of the kind
                self._counter(USAGE_BY_TYPE[kind]).add(labels.usage, count)
        return usage

    def record_request(
        self, s: RequestStats, windows: Sequence[TokenWindow] = (), trace: TraceRef | None = None
    ) -> Verdict | None:
        """A request a test or benchmark makes, recorded as an observer's would be
        (``judged``, then consumed); returns its verdict."""
        record = self.judged(s, windows, trace)
        self.consume(record)
        return record.verdict

    def judged(
        self, s: RequestStats, windows: Sequence[TokenWindow] = (), trace: TraceRef | None = None
    ) -> RequestRecord:
        """The record of a request no observer saw to its end (one the server refused
        unparsed): labelled and judged here as an observer would, against these objectives."""
        verdict = judge(self.objectives.for_request(s.operation, s.model), s)
        label, tenant = self.labels(s.model, None, 200 <= s.status < 400)
        return RequestRecord(s, tuple(windows), verdict, trace, label, tenant=tenant)

    def consume(self, record: RequestRecord) -> None:
        """A finished request into every request series, and its last windows of ITLs
        (those ``record_tokens`` did not take mid-stream) under the same labels, all under
        one lock, its verdict into the SLO series. With the request's trace, its
        observations are their buckets' exemplars (if the trace is kept).
        A window that fails to record is raised after everything else about the request is
        recorded."""
        s, windows, verdict, trace, label, phases, stalls, tenant, cost = record
        labels = self._sets.get((s.operation, label, tenant))
        if labels is None:
            labels = self._label_set(s.operation, label, tenant)
        row = labels.row
        assert row is not None
        status = _STATUS_CLASSES.get(s.status) or status_class(s.status)
        exemplar = None
        if trace is not None and (trace.kept_if_good or (verdict is not None and not verdict.good)):
            exemplar = (trace.trace_id, trace.span_id, self._clock())
        failed: Exception | None = None
        with self._lock:
            # an enum's ``_value_`` is a plain attribute; ``.value`` is a Python-level property
            self._requests.add((*labels.requests, s.outcome._value_, status, s.finish_reason), 1)
            usage = self._record_tokens(labels, s)
            # the row's members in order: _OBSERVED's, the usage histogram's, the phases'
            values = (s.duration_s, s.ttft_s, s.tpot_s, s.smoothness, s.engine_prompt_eval_s,
                      s.engine_load_s, *usage,
                      *(_NO_PHASES if phases is None else _seconds(phases)))  # fmt: skip
            row.observe_all(values, exemplar)
            if s.stalls:
                for cause, count in count_causes(s.stalls, stalls):
                    self._stalls.add((*labels.stalls, cause._value_), count)
            if verdict is not None:
                self._record_verdict(labels, verdict, s.output_tokens)
            if cost is not None and self._cost is not None:
                judged = cost_verdict(verdict)
                self._cost.add((*labels.cost, judged, self.currency), cost)
            for window in windows:
                if len(window.values):
                    try:
                        self._itl.record(labels.itl, window)
                    except Exception as exc:  # raised below, once the request is recorded
                        failed = exc
            if exemplar is not None and s.itl_count:  # the ITL's: the request's worst gap
                self._itl.exemplar(labels.itl, s.itl_max, exemplar)
        if failed is not None:
            raise failed

    def _record_verdict(self, labels: _LabelSet, verdict: Verdict, output_tokens: int) -> None:
        """A judged request: good or bad, what it missed, and its output tokens (hold the
        lock)."""
        if verdict.good:
            self._slo_requests.add(labels.good, 1)
            self._slo_tokens.add(labels.good, output_tokens)
            return
        self._slo_requests.add(labels.bad, 1)
        self._slo_tokens.add(labels.bad, output_tokens)
        key = labels.slo
        for objective, cause in zip(verdict.missed, verdict.causes, strict=True):
            self._slo_misses.add((*key, objective._value_, cause), 1)


def _seconds(phases: TtftPhases) -> tuple[float | None, ...]:
    """A request's TTFT phases in seconds, in ``_PHASES``' order (None: not reported)."""
    before, load, queue, prefill, other = phases
    if load is None and queue is None and prefill is None:  # most engines: no generator
        return before / 1e9, None, None, None, other / 1e9
    return tuple(None if ns is None else ns / 1e9 for ns in phases)
