"""The sink: finished requests and token windows into the catalogue's series.

Recording does not go through the OpenTelemetry SDK: its ``Histogram.record`` costs more than
a whole request's plain-Python recording, a request needs ten, and the SDK's Prometheus
exporter rebuilds every family at each scrape (docs/benchmarks.md has the figures).
Each series is a plain-Python accumulator (``series``) exposed by one prometheus_client
collector on the registry /metrics renders, with the exposition the exporter produced (names,
types, labels, buckets): a request costs a few microseconds. What a request observes, under
which labels, is the mapping's (``mapping.RequestMapping``), which the OTLP consumer shares;
the sink stores it: each label set is bound once (its ``mapping.LabelSet`` and a
``HistogramRow``), so recording a request is a few list updates under one lock. The per-token
ITL histogram is binned a window at a time (``series.TokenHistogram``), with the sum of
squares that makes ITL variance aggregable across pods.

Labels come from bounded sets, admitted once in observation (``observe.labels``): the sink
stores under the labels a record carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

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
from llmobs.export.metrics.mapping import LabelSet, RequestMapping, exemplar_of
from llmobs.export.metrics.series import (
    CounterFamily,
    Family,
    HistogramFamily,
    HistogramRow,
    SeriesCollector,
    TokenHistogram,
)
from llmobs.observe.labels import UNKNOWN
from llmobs.observe.record import RequestRecord
from llmobs.observe.window import TokenWindow

_LIVE = (ACTIVE, QUEUE_DEPTH, OBSERVER_ERRORS, MALFORMED)  # the label-less series
_Bound = tuple[LabelSet, HistogramRow]  # a label set's values, and its histograms' row


class MetricsSink:
    """Records finished requests and token windows into the catalogue's request series.

    ``registry`` is the one /metrics renders (the sink registers its collector there; None:
    the caller does); ``mapping``: the request families and what a record observes in them;
    ``provider``: the ``gen_ai.provider.name`` value until ``set_provider``.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None,
        mapping: RequestMapping | None = None,
        clock: Callable[[], float] = time.time,
        provider: str = UNKNOWN,
    ) -> None:
        self.mapping = mapping = mapping or RequestMapping()
        self.provider = provider
        self._clock = clock  # unix seconds: when an exemplar was seen
        self._sets: dict[tuple[str, str, str], _Bound] = {}  # by (operation, model, tenant)
        self._itl = TokenHistogram(mapping.define(ITL), mapping.define(ITL_SQUARES))
        # every request series, by the catalogue's metric (readers: the live page's totals)
        self.families: dict[MetricDef, Family] = {m: self._family(m) for m in mapping.metrics}
        self._counters = {m: f for m, f in self.families.items() if isinstance(f, CounterFamily)}
        self._histograms = {
            m: f for m, f in self.families.items() if isinstance(f, HistogramFamily)
        }
        # the label-less ones (gauges, and counters of the sidecar's own errors): zero-valued
        # series up front, so dashboards and alerts see 0 rather than no data
        self._active, self._queue, self._errors, self._malformed = live = [
            self._counters[m] for m in _LIVE
        ]
        for family in live:
            family.series[()] = 0
        self.collector = SeriesCollector(tuple(self.families.values()))
        self._lock = self.collector.lock
        for key in mapping.closed_label_sets():
            self._label_set(*key)
        if registry is not None:
            registry.register(self.collector)

    def _family(self, metric: MetricDef) -> Family:
        if metric is ITL:
            return self._itl.histogram
        if metric is ITL_SQUARES:
            return self._itl.squares
        if metric.kind is Kind.HISTOGRAM:
            return HistogramFamily(self.mapping.define(metric))
        return CounterFamily(self.mapping.define(metric), gauge=metric.kind is Kind.UPDOWN)

    def define(self, metric: MetricDef) -> MetricDef:
        """The metric as this sink exposes it (``RequestMapping.define``)."""
        return self.mapping.define(metric)

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

    def _label_set(self, operation: str, label: str, tenant: str) -> _Bound:
        """The series of a request's labels, bound on first use, its counters' at 0 and its
        objective's settings there from the start."""
        found = self._sets.get((operation, label, tenant))
        if found is not None:
            return found
        mapping = self.mapping
        labels = mapping.label_set(operation, label, tenant, self.provider)
        histograms = self._histograms
        row = HistogramRow([(histograms[m], key) for m, key in labels.histograms])
        counters = self._counters
        with self._lock:  # at 0 from the start: rate() over a healthy model reads 0
            for metric, key in mapping.zeros(labels):
                counters[metric].series.setdefault(key, 0)
            for metric, key, value in mapping.settings(labels):
                counters[metric].series[key] = value
        found = self._sets[(operation, label, tenant)] = (labels, row)
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

    def answered(self, operation: str, label: str, tenant: str) -> None:
        """The engine answered a request (a 2xx or 3xx head) whose labels were admitted:
        its label set's series appear at 0 now, before the request is counted at its end,
        so that even its first requests are an increase to a scrape."""
        if (operation, label, tenant) not in self._sets:
            self._label_set(operation, label, tenant)

    def record_tokens(self, operation: str, label: str, window: TokenWindow, tenant: str) -> None:
        """Add a window of ITLs taken mid-stream (a long stream's; the last windows go with
        the request's record) under the request's model (and tenant) label."""
        if window.size:
            key = self._label_set(operation, label, tenant)[0].itl
            with self._lock:
                self._itl.record(key, window)

    def consume(self, record: RequestRecord) -> None:
        """A finished request into every request series (its observations, from the
        mapping), and its last windows of ITLs (those ``record_tokens`` did not take
        mid-stream) under the same labels, all under one lock. With the request's trace (if
        kept), its observations are their buckets' exemplars. A window that fails to record
        is raised after everything else about the request is recorded."""
        s = record.stats
        bound = self._sets.get((s.operation, record.label, record.tenant))
        if bound is None:
            bound = self._label_set(s.operation, record.label, record.tenant)
        labels, row = bound
        values, counts = self.mapping.observe(record, labels)
        exemplar = None
        if record.trace is not None:
            trace = exemplar_of(record)
            if trace is not None:
                exemplar = (trace.trace_id, trace.span_id, self._clock())
        counters, itl, failed = self._counters, self._itl, None
        with self._lock:
            for metric, key, value in counts:
                counters[metric].add(key, value)
            row.observe_all(values, exemplar)
            for window in record.windows:
                if len(window.values):
                    try:
                        itl.record(labels.itl, window)
                    except Exception as exc:  # raised below, once the request is recorded
                        failed = exc
            if exemplar is not None and s.itl_count:  # the ITL's: the request's worst gap
                itl.exemplar(labels.itl, s.itl_max, exemplar)
        if failed is not None:
            raise failed
