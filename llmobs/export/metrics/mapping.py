"""The one mapping from a finished request's record to what it observes: which family, which
value, under which label values, with which exemplar.

Both exporters of the request metrics take a request's observations from here: the
Prometheus series (``sink.MetricsSink``) and the OTLP instruments (``otel.OtelMetrics``), so
the two can never count a request differently, and neither imports the other. A family's
label values are the catalogue's label names in order (``MetricDef.labels`` as ``define``
gives them: the tenant's after the model's where the operator labels it by tenant), so an
observation's key is a Prometheus series' label values and, zipped with the names, an OTLP
data point's attributes.

A label set (``LabelSet``: an operation, a model's and a tenant's labels, the provider) is
bound once by each exporter, which keeps it: a request then makes only its own values (its
outcome, its token counts, its verdict). Adding a per-request family is its ``MetricDef`` in
the catalogue and one line here (docs/architecture.md, "How to add").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from llmobs.config.buckets import Buckets
from llmobs.config.objectives import Objectives, ObjectiveSet
from llmobs.config.tenants import Tenancy
from llmobs.export.metrics.catalogue import (
    BUCKET_METRICS,
    COST,
    DURATION,
    ENGINE_LOAD,
    ENGINE_PROMPT_EVAL,
    INPUT_TOKENS,
    ITL,
    NO_MODALITY,
    OUTPUT_TOKENS,
    PROVIDER,
    REQUESTS,
    SLO_BOUND,
    SLO_LATENCY_RATIO,
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
    MetricDef,
    request_metrics,
    status_class,
)
from llmobs.observe.causes import STALL_CAUSES, count_causes
from llmobs.observe.cost import cost_verdict
from llmobs.observe.dialects import OPERATIONS
from llmobs.observe.labels import OTHER, UNKNOWN
from llmobs.observe.phases import Phase, TtftPhases
from llmobs.observe.record import RequestRecord, TraceRef
from llmobs.observe.slo import Verdict, miss_causes
from llmobs.observe.timing import RequestStats, TokenSource

Number = int | float
Key = tuple[str, ...]
Count = tuple[MetricDef, Key, Number]  # a counter's (or gauge's) family, label values, amount

_STATUS_CLASSES = {status: status_class(status) for status in range(600)}
_USAGE = TokenSource.USAGE.value
# The request histograms a label set binds, in the order ``observe`` gives their values: these,
# then the token usage twice (v1.41's histogram by type, input then output, or the newest
# conventions' histogram of each direction), then the TTFT phases' histogram once per phase
_OBSERVED = (DURATION, TTFT, TPOT, SMOOTHNESS, ENGINE_PROMPT_EVAL, ENGINE_LOAD, SLO_LATENCY_RATIO)
_USAGE_TYPES = ("input", "output")  # the token types of v1.41's usage histogram, in order
_PHASES = tuple(Phase)  # in ``TtftPhases``' order (``phases`` keeps the two the same)
# no TTFT phases: none observed (the row's histograms past the values given are left alone,
# ``series.Row.observe_all``: a request without a first token costs no loop over them)
_NO_PHASES: tuple[None, ...] = ()
_VERDICTS = ("good", "bad")


class LabelSet:
    """The label values of one (operation, model, tenant) label set under one provider, in
    each request family, up to the request's own: bound once per label set, so recording a
    request builds only the tuples its own values end. ``histograms``: the request histograms
    in the order ``RequestMapping.observe`` gives their values, with their label values."""

    __slots__ = ("bound", "cost", "histograms", "itl", "key", "misses", "requests", "slo",
                 "stalls", "target", "tenant", "tokens", "usage", "window")  # fmt: skip

    def __init__(self, mapping: RequestMapping, key: tuple[str, str], tenant: str, provider: str):
        self.key = key  # (operation, model)
        self.tenant = tenant
        tenanted = mapping.tenanted
        full = (*key, tenant)

        def prefix(metric: MetricDef) -> Key:
            values = full if metric in tenanted else key
            return (*values, provider) if PROVIDER in metric.labels else values

        self.requests, self.tokens, self.stalls = prefix(REQUESTS), prefix(TOKENS), prefix(STALLS)
        self.misses, self.cost, self.itl = prefix(SLO_MISSES), prefix(COST), prefix(ITL)
        self.target, self.window = prefix(SLO_TARGET), prefix(SLO_WINDOW)
        self.bound = prefix(SLO_BOUND)
        # the SLO counters' series by verdict: (requests, output tokens) for good, then bad
        self.slo = {
            verdict: ((*prefix(SLO_REQUESTS), verdict), (*prefix(SLO_OUTPUT_TOKENS), verdict))
            for verdict in _VERDICTS
        }
        self.usage = {kind: (*prefix(m), NO_MODALITY) for kind, m in USAGE_BY_TYPE.items()}
        members = [(m, prefix(m)) for m in _OBSERVED]
        if mapping.latest:
            members += [(m, prefix(m)) for m in (INPUT_TOKENS, OUTPUT_TOKENS)]
        else:
            members += [(TOKEN_USAGE, (*prefix(TOKEN_USAGE), kind)) for kind in _USAGE_TYPES]
        members += [(TTFT_PHASE, (*prefix(TTFT_PHASE), phase._value_)) for phase in _PHASES]
        self.histograms: tuple[tuple[MetricDef, Key], ...] = tuple(members)


class RequestMapping:
    """What each request family is on this sidecar, and what a record observes in it.

    ``objectives``: what requests are judged by (each label set's target and window);
    ``tenancy``: the operator's tenants and the families they label; ``currency``: the price
    file's (no cost family without one); ``buckets``: the operator's classic bounds per
    family; ``latest``: the newest GenAI conventions' token usage."""

    def __init__(
        self,
        objectives: Objectives | None = None,
        tenancy: Tenancy | None = None,
        currency: str = "",
        buckets: Buckets = (),
        latest: bool = False,
    ) -> None:
        self.objectives = objectives or Objectives(ObjectiveSet())
        self.latest = latest
        self.currency = currency
        self.tenants = tenancy is not None and tenancy.on  # whether requests have a tenant label
        names = tenancy.metrics if tenancy is not None and self.tenants else ()
        self.tenanted = frozenset(m for name in names for m in TENANT_METRICS[name])
        self._bounds = {BUCKET_METRICS[name]: bounds for name, bounds in buckets}
        # every request family of this sidecar, in the order /metrics lists them
        self.metrics = tuple(m for m in request_metrics(latest) if m is not COST or currency)

    def define(self, metric: MetricDef) -> MetricDef:
        """The metric as this sidecar exposes it: with the tenant label if labelled so, with
        the operator's bucket bounds if set."""
        bounds = self._bounds.get(metric)
        defined = metric if bounds is None else dataclasses.replace(metric, buckets=bounds)
        return defined.with_tenant() if metric in self.tenanted else defined

    def label_set(self, operation: str, model: str, tenant: str, provider: str) -> LabelSet:
        """The label values of a label set in every family."""
        return LabelSet(self, (operation, model), tenant, provider)

    def closed_label_sets(self) -> list[tuple[str, str, str]]:
        """The label sets of the closed values (a model past the cap, none named; likewise a
        tenant), for every operation: their series exist from the start, at 0, so that a
        first burst of errors is an increase a scrape can see."""
        tenants = (UNKNOWN, OTHER) if self.tenants else ("",)
        return [(op, model, tenant) for op in OPERATIONS for model in (OTHER, UNKNOWN)
                for tenant in tenants]  # fmt: skip

    def _objective_set(self, labels: LabelSet) -> ObjectiveSet:
        return self.objectives.for_request(*labels.key, labels.tenant or None)

    def zeros(self, labels: LabelSet) -> list[tuple[MetricDef, Key]]:
        """The counters' series a label set has at 0 from its start (``rate()`` over a
        healthy model then reads 0, not "no data"): stalls by cause, the SLO's good and bad,
        its misses by objective and cause."""
        out: list[tuple[MetricDef, Key]] = [
            (STALLS, (*labels.stalls, cause._value_)) for cause in STALL_CAUSES
        ]
        for index, metric in enumerate((SLO_REQUESTS, SLO_OUTPUT_TOKENS)):
            out += [(metric, labels.slo[verdict][index]) for verdict in _VERDICTS]
        for objective in self._objective_set(labels).objectives:
            out += [(SLO_MISSES, (*labels.misses, objective.value, cause))
                    for cause in miss_causes(objective)]  # fmt: skip
        return out

    def settings(self, labels: LabelSet) -> list[Count]:
        """A label set's objective: its target, window and bounds (gauges, set once)."""
        objective_set = self._objective_set(labels)
        bound = labels.bound
        return [(SLO_TARGET, labels.target, objective_set.target),
                (SLO_WINDOW, labels.window, objective_set.window),
                *((SLO_BOUND, (*bound, objective), value)
                  for objective, value in objective_set.bounds())]  # fmt: skip

    def observe(
        self, record: RequestRecord, labels: LabelSet
    ) -> tuple[tuple[Number | None, ...], list[Count]]:
        """A finished request's observations under ``labels``: its histograms' values in
        ``labels.histograms``' order (None: not observed), and its counters' additions in the
        order they first appear. The per-token ITL windows are the Prometheus series' alone
        (binned in bulk, which the OTel SDK cannot take)."""
        s = record.stats
        status = _STATUS_CLASSES.get(s.status) or status_class(s.status)
        counts: list[Count] = [
            (REQUESTS, (*labels.requests, s.outcome._value_, status, s.finish_reason), 1)
        ]
        usage = self._tokens(s, labels, counts)
        phases = record.phases
        values = (s.duration_s, s.ttft_s, s.tpot_s, s.smoothness, s.engine_prompt_eval_s,
                  s.engine_load_s, record.ratio, *usage,
                  *(_NO_PHASES if phases is None else _seconds(phases)))  # fmt: skip
        if s.stalls:
            counts += [(STALLS, (*labels.stalls, cause._value_), n)
                       for cause, n in count_causes(s.stalls, record.stalls)]  # fmt: skip
        verdict = record.verdict
        if verdict is not None:
            _verdict(verdict, s.output_tokens, labels, counts)
        if record.cost is not None and self.currency:
            judged = cost_verdict(verdict)
            counts.append((COST, (*labels.cost, judged, self.currency), record.cost))
        return values, counts

    def _tokens(
        self, s: RequestStats, labels: LabelSet, counts: list[Count]
    ) -> tuple[int | None, int | None]:
        """The request's token counts by type and source into ``counts`` (input and output;
        reasoning within output, cached within input, when the engine reports them; and,
        opted in, the newest conventions' counter of each kind); returns the input and output
        counts for the usage histograms (None: not observed). Written out, not looped over
        a table: it is on every request's path."""
        tokens, first = labels.tokens, len(counts)
        given = s.input_tokens
        output = s.output_tokens if s.output_tokens or s.ttft_s is not None else None
        if given is not None:
            counts.append((TOKENS, (*tokens, "input", _USAGE), given))
        if output is not None:
            counts.append((TOKENS, (*tokens, "output", s.token_source._value_), output))
        if s.reasoning_tokens:
            reasoning = (*tokens, "reasoning", s.reasoning_source._value_)
            counts.append((TOKENS, reasoning, s.reasoning_tokens))
        if s.cached_tokens:
            counts.append((TOKENS, (*tokens, "cached_input", _USAGE), s.cached_tokens))
        if self.latest:  # the same counts, by kind, into the newest conventions' counters
            usage = labels.usage
            for _, key, count in counts[first:]:
                kind = key[-2]
                counts.append((USAGE_BY_TYPE[kind], usage[kind], count))
        return given, output


def exemplar_of(record: RequestRecord) -> TraceRef | None:
    """The trace a request's observations point at, if its trace is kept: always when it is
    bad, when it is good only if good traces are kept (tail sampling)."""
    trace, verdict = record.trace, record.verdict
    if trace is not None and (trace.kept_if_good or (verdict is not None and not verdict.good)):
        return trace
    return None


def _verdict(verdict: Verdict, output_tokens: int, labels: LabelSet, counts: list[Count]) -> None:
    """A judged request: good or bad, its output tokens, what it missed and why."""
    requests, tokens = labels.slo["good" if verdict.good else "bad"]
    counts.append((SLO_REQUESTS, requests, 1))
    counts.append((SLO_OUTPUT_TOKENS, tokens, output_tokens))
    if not verdict.good:
        misses = labels.misses
        for objective, cause in zip(verdict.missed, verdict.causes, strict=True):
            counts.append((SLO_MISSES, (*misses, objective._value_, cause), 1))


def _seconds(phases: TtftPhases) -> Sequence[float | None]:
    """A request's TTFT phases in seconds, in ``_PHASES``' order (None: not reported; the
    phases of disaggregated prefill left off the end when none is known)."""
    before, load, queue, prefill, other, remote, transfer, first = phases
    if (load is None and queue is None and prefill is None
            and remote is None and transfer is None and first is None):  # fmt: skip
        return before / 1e9, None, None, None, other / 1e9  # no generator; P/D's left off
    return tuple(None if ns is None else ns / 1e9 for ns in phases)
