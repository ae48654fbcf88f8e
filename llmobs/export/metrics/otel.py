"""The request-level metrics as OpenTelemetry instruments, for an OTLP push.

Built only when metrics are pushed over OTLP (``Telemetry.push_meter``): every request then
pays the SDK's cost per record (docs/benchmarks.md) on top of the Prometheus series
(``sink``). The instruments
are made from the catalogue, one per request-level metric (the per-token ITL histogram is
Prometheus only: its windows are binned in bulk, which the SDK cannot take).
"""

from __future__ import annotations

from opentelemetry.metrics import Counter, Histogram, Meter, UpDownCounter

from llmobs.export.metrics.catalogue import (
    ACTIVE,
    DURATION,
    ENGINE_LOAD,
    ENGINE_PROMPT_EVAL,
    FINISH_REASON,
    ITL,
    ITL_SQUARES,
    MALFORMED,
    MODEL,
    OBJECTIVE,
    OBSERVER_ERRORS,
    OPERATION,
    OUTCOME,
    QUEUE_DEPTH,
    REQUEST_METRICS,
    REQUESTS,
    SLO_MISSES,
    SLO_OUTPUT_TOKENS,
    SLO_REQUESTS,
    SMOOTHNESS,
    STALLS,
    STATUS_CLASS,
    TOKEN_SOURCE,
    TOKEN_TYPE,
    TOKEN_USAGE,
    TOKENS,
    TPOT,
    TTFT,
    VERDICT,
    Kind,
    MetricDef,
)
from llmobs.observe.slo import Verdict
from llmobs.observe.timing import StreamStats, TokenSource

Instrument = Counter | Histogram | UpDownCounter

_USAGE = TokenSource.USAGE.value


def token_counts(s: StreamStats) -> list[tuple[str, str, int]]:
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


class OtelInstruments:
    """One instrument per request-level metric of the catalogue, on ``meter``."""

    def __init__(self, meter: Meter) -> None:
        self._by_metric = {
            m: _instrument(meter, m) for m in REQUEST_METRICS if m not in (ITL, ITL_SQUARES)
        }
        for m in (ACTIVE, QUEUE_DEPTH, OBSERVER_ERRORS, MALFORMED):  # 0 from the start
            self.add(m, 0)

    def add(
        self, metric: MetricDef, value: float, attributes: dict[str, str] | None = None
    ) -> None:
        """Add to a counter or an up-down counter."""
        instrument = self._by_metric[metric]
        assert not isinstance(instrument, Histogram)
        instrument.add(value, attributes)

    def record(self, metric: MetricDef, value: float, attributes: dict[str, str]) -> None:
        """Record into a histogram."""
        instrument = self._by_metric[metric]
        assert isinstance(instrument, Histogram)
        instrument.record(value, attributes)

    def record_verdict(self, verdict: Verdict, output_tokens: int, op: str, model: str) -> None:
        """A judged request's verdict, its misses and its output tokens."""
        attrs = {OPERATION: op, MODEL: model}
        label = "good" if verdict.good else "bad"
        self.add(SLO_REQUESTS, 1, {**attrs, VERDICT: label})
        for objective in verdict.missed:
            self.add(SLO_MISSES, 1, {**attrs, OBJECTIVE: objective.value})
        self.add(SLO_OUTPUT_TOKENS, output_tokens, {**attrs, VERDICT: label})

    def record_request(self, s: StreamStats, op: str, model: str, status: str) -> None:
        attrs = {OPERATION: op, MODEL: model}
        labels = {**attrs, OUTCOME: s.outcome.value, STATUS_CLASS: status}
        self.add(REQUESTS, 1, {**labels, FINISH_REASON: s.finish_reason})
        self.record(DURATION, s.duration_s, attrs)
        for metric, value in (
            (TTFT, s.ttft_s),
            (TPOT, s.tpot_s),
            (SMOOTHNESS, s.smoothness),
            (ENGINE_PROMPT_EVAL, s.engine_prompt_eval_s),
            (ENGINE_LOAD, s.engine_load_s),
        ):
            if value is not None:
                self.record(metric, value, attrs)
        if s.stalls:
            self.add(STALLS, s.stalls, attrs)
        for kind, source, count in token_counts(s):
            if kind in ("input", "output"):
                self.record(TOKEN_USAGE, count, {**attrs, TOKEN_TYPE: kind})
            self.add(TOKENS, count, {**attrs, TOKEN_TYPE: kind, TOKEN_SOURCE: source})
