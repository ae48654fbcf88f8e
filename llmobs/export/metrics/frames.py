"""The neutral family model: what a family of request series is (``Shape``) and its values at
one scrape (``Frame``). The families (``series``) hold the values and make frames; the
encoders (``text``, ``openmetrics``, ``protobuf``) turn frames into bytes, each in its format.

A frame is columnar, not an object per sample as prometheus_client's model is: at the label
cap a scrape holds hundreds of thousands of numbers, and an object each would be as many for
the garbage collector to walk while the relay's loop waits. ``client_family`` gives
prometheus_client's model of a frame all the same, for ``collect()`` (readers of the registry,
and the writers a registry of another class goes to).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar as ClientExemplar

from llmobs.export.metrics import native
from llmobs.export.metrics.catalogue import MetricDef

Number = int | float
Key = tuple[str, ...]
# A family's series: their label values, and their numbers (a histogram's buckets and sum,
# series after series).
Snapshot = tuple[list[Key], list[Number]]
# A bucket's exemplar: the trace and span of a request that fell into it, the value observed,
# and when (unix seconds). At most one per bucket, the latest (OpenMetrics keeps one per line).
Exemplar = tuple[str, str, float, float]
Exemplars = dict[Key, list[Exemplar | None]]
Natives = dict[Key, native.Snapshot]


class Type(enum.Enum):
    """What a family is to Prometheus (its ``# TYPE``)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Shape:
    """A family apart from its values: its sample name, help, type, label names and (a
    histogram's) bucket bounds. Made once per family: an encoder keeps what it derives from a
    shape (header lines, each series' text up to its value) keyed by it."""

    __slots__ = ("__weakref__", "bounds", "help", "labels", "name", "size", "type")

    def __init__(
        self, name: str, help_: str, type_: Type, labels: tuple[str, ...], bounds: tuple[float, ...]
    ) -> None:
        self.name = name
        self.help = help_
        self.type = type_
        self.labels = labels
        self.bounds = bounds
        self.size = len(bounds) + 1  # a histogram's buckets, +Inf included: its sum's index

    @classmethod
    def of(cls, metric: MetricDef, type_: Type) -> Shape:
        """``metric``'s family as the OpenTelemetry Prometheus exporter named it: a counter's
        samples end in ``_total`` (the family's name, in OpenMetrics, does not)."""
        name = metric.prometheus
        if type_ is Type.COUNTER:
            name = name.removesuffix("_total") + "_total"
        bounds = tuple(float(b) for b in metric.buckets) if type_ is Type.HISTOGRAM else ()
        return cls(name, metric.description, type_, metric.prometheus_labels, bounds)

    def edges(self) -> list[str]:
        """The ``le`` of each bucket, as the text formats write them."""
        return [repr(b) for b in self.bounds] + ["+Inf"]


class Frame(NamedTuple):
    """A family's series at one scrape, in the order they first appeared: the label values of
    each, and their numbers end to end (a counter's or gauge's value; a histogram's count in
    each bucket, not cumulative, +Inf last, then its sum: ``shape.size + 1`` numbers). With
    its bucket exemplars and native buckets where the encoder asked for them."""

    shape: Shape
    keys: list[Key]
    values: list[Number]
    exemplars: Exemplars | None = None
    natives: Natives | None = None


def client_family(frame: Frame) -> Metric:
    """prometheus_client's family of ``frame``, each bucket with its exemplar (if the frame
    has one: the OpenMetrics writer shows them)."""
    shape = frame.shape
    if shape.type is Type.HISTOGRAM:
        return _client_histogram(frame)
    out: CounterMetricFamily | GaugeMetricFamily
    if shape.type is Type.GAUGE:
        out = GaugeMetricFamily(shape.name, shape.help, labels=shape.labels)
    else:
        out = CounterMetricFamily(
            shape.name.removesuffix("_total"), shape.help, labels=shape.labels
        )
    for key, value in zip(frame.keys, frame.values, strict=True):
        out.add_metric(key, value)
    return out


def _client_histogram(frame: Frame) -> Metric:
    shape = frame.shape
    out = HistogramMetricFamily(shape.name, shape.help, labels=shape.labels, unit="")
    edges, size, exemplars = shape.edges(), shape.size, frame.exemplars
    values = frame.values
    for n, key in enumerate(frame.keys):
        series = values[n * (size + 1) : (n + 1) * (size + 1)]
        slots = exemplars.get(key) if exemplars else None
        buckets: list[Any] = []
        total: Number = 0
        for i in range(size):
            total += series[i]
            found = slots[i] if slots is not None else None
            if found is None:
                buckets.append((edges[i], total))
            else:
                trace_id, span_id, value, at = found
                labels = {"trace_id": trace_id, "span_id": span_id}
                buckets.append((edges[i], total, ClientExemplar(labels, value, at)))
        out.add_metric(key, buckets, series[size])
    return out
