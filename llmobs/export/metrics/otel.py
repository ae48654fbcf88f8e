"""The request-level metrics as OpenTelemetry instruments, for an OTLP push.

A consumer of the request records (``OtelMetrics``), assembled only when metrics are pushed
over OTLP (``Telemetry.push_meter``): every request then pays the SDK's cost per record
(docs/benchmarks.md) on top of the Prometheus series (``sink``). What a record observes, and
under which labels, is the mapping's (``mapping.RequestMapping``), the same the Prometheus
series take, so the two never disagree. The instruments are made from the catalogue, one per
request-level metric (the per-token ITL histogram is Prometheus only: its windows are binned
in bulk, which the SDK cannot take); the label-less series (requests active and queued, the
sidecar's own error counts) are read from the sink at each export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry.metrics import (
    CallbackOptions,
    Counter,
    Histogram,
    Meter,
    Observation,
    UpDownCounter,
)

from llmobs.export.metrics.catalogue import (
    ACTIVE,
    ITL,
    ITL_SQUARES,
    MALFORMED,
    OBSERVER_ERRORS,
    QUEUE_DEPTH,
    Kind,
    MetricDef,
)
from llmobs.export.metrics.mapping import Key, LabelSet, RequestMapping
from llmobs.observe.provider import Provider
from llmobs.observe.record import RequestRecord

Instrument = Counter | Histogram | UpDownCounter
Attributes = dict[str, str]

_LIVE = (ACTIVE, QUEUE_DEPTH, OBSERVER_ERRORS, MALFORMED)  # the sink's label-less series


def histogram_of(meter: Meter, m: MetricDef) -> Histogram:
    """The catalogue's histogram ``m`` on ``meter``, with its buckets."""
    return meter.create_histogram(
        m.name, unit=m.unit, description=m.description,
        explicit_bucket_boundaries_advisory=list(m.buckets),
    )  # fmt: skip


def counter_of(meter: Meter, m: MetricDef) -> Counter:
    """The catalogue's counter ``m`` on ``meter``."""
    return meter.create_counter(m.name, m.unit, m.description)


def _instrument(meter: Meter, m: MetricDef) -> Instrument:
    if m.kind is Kind.HISTOGRAM:
        return histogram_of(meter, m)
    if m.kind is Kind.UPDOWN:
        return meter.create_up_down_counter(m.name, m.unit, m.description)
    return counter_of(meter, m)


class _Bound:
    """A label set as the instruments take it: its values, and its histograms' attributes."""

    __slots__ = ("histograms", "labels")

    def __init__(self, labels: LabelSet, histograms: list[tuple[Histogram, Attributes]]) -> None:
        self.labels = labels
        self.histograms = histograms


class OtelMetrics:
    """Each request's record into one instrument per request-level metric on ``meter`` (whose
    only reader pushes over OTLP); ``live`` gives the label-less series at each export; each
    label set's objective (target, window) is added once, at its first request."""

    def __init__(
        self,
        meter: Meter,
        mapping: RequestMapping,
        live: Callable[[], Mapping[MetricDef, float]],
        provider: Provider | None = None,
    ) -> None:
        """``mapping``: the request families, as the sink's; ``provider``: the
        ``gen_ai.provider.name`` the GenAI families carry."""
        self._mapping = mapping
        self._provider = provider or Provider(engine_metrics=False)
        defined = {m: mapping.define(m) for m in mapping.metrics}
        self._by_metric = {
            m: _instrument(meter, d)
            for m, d in defined.items()
            if m not in (ITL, ITL_SQUARES, *_LIVE)
        }
        self._names = {m: d.labels for m, d in defined.items()}  # an attribute's name per value
        self._live = live
        for m in _LIVE:
            make = (
                meter.create_observable_up_down_counter
                if m.kind is Kind.UPDOWN
                else meter.create_observable_counter
            )
            make(m.name, [self._observe(m)], m.unit, m.description)
        self._sets: dict[tuple[str, str, str, str], _Bound] = {}

    def _observe(self, metric: MetricDef) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._live()[metric])]

        return observe

    def _attributes(self, metric: MetricDef, key: Key) -> Attributes:
        return dict(zip(self._names[metric], key, strict=True))

    def _bound(self, record: RequestRecord) -> _Bound:
        """The record's label set, bound at its first request (its objective added then)."""
        key = (record.stats.operation, record.label, record.tenant, self._provider.name)
        found = self._sets.get(key)
        if found is None:
            labels = self._mapping.label_set(*key)
            by_metric = self._by_metric
            histograms = [
                (by_metric[m], self._attributes(m, values)) for m, values in labels.histograms
            ]
            found = self._sets[key] = _Bound(labels, histograms)  # type: ignore[arg-type]
            for metric, values, amount in self._mapping.settings(labels):
                self._add(metric, values, amount)
        return found

    def _add(self, metric: MetricDef, key: Key, value: float) -> None:
        instrument = self._by_metric[metric]
        assert not isinstance(instrument, Histogram)
        instrument.add(value, self._attributes(metric, key))

    def consume(self, record: RequestRecord) -> None:
        """A finished request: its observations (``RequestMapping.observe``)."""
        bound = self._bound(record)
        values, counts = self._mapping.observe(record, bound.labels)
        # (values may stop short of the histograms: those past them observe nothing)
        for (histogram, attributes), value in zip(bound.histograms, values, strict=False):
            if value is not None:
                histogram.record(value, attributes)
        for metric, key, amount in counts:
            self._add(metric, key, amount)
