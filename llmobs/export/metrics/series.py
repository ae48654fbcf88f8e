"""The families of series: histograms and counters kept in plain Python lists.

The only code that knows a series' layout (a histogram's bucket counts, then its sum): the
sink records through a handle bound once per label set (``HistogramRow``, as
prometheus_client's ``.labels()`` child, for a request's several histograms at once); a
scrape reads frames of them (``frames``), which the encoders write.

Why not the OpenTelemetry SDK on this path: one ``Histogram.record()`` or ``Counter.add()``
costs ~9 us (attribute-set hashing, a lock and an aggregation object per call), and a request
makes ten of them; its Prometheus exporter then rebuilds every family from data points on each
scrape. Here a series is a list (bucket counts, then the sum) found by one dict lookup on a
tuple of label values; an observation is a ``bisect`` and two additions.

What the families hold is what the OpenTelemetry Prometheus exporter showed for the same
instruments: same family names and types, label names and values, bucket bounds, series in the
order they first appeared, integer sums kept integers, no ``_created`` samples. A scrape takes
every family's series at once as frames (``frames.Frame``) and an encoder writes them
(``text``, ``openmetrics``, ``protobuf``); ``tests/unit/export/metrics/test_exposition.py``
compares the bytes to prometheus_client's writers, and ``test_sink.py`` holds a golden
exposition.

Thread safety: observations happen on the event loop, scrapes (``frames``, ``collect``) there
or in the /metrics rendering thread. Writers hold the owner's lock (``SeriesCollector.lock``)
for a whole request's updates, and a scrape copies every series under it (the lists only:
counter values are immutable numbers), so it never sees half a request. A label-less series (a
gauge's one number, its key there from the start) is written by the loop alone without the
lock: a scrape reads its old value or its new one.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from math import frexp, inf

import numpy as np
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from llmobs.export.metrics.catalogue import MetricDef
from llmobs.export.metrics.frames import (
    Exemplar,
    Exemplars,
    Frame,
    Key,
    Natives,
    Number,
    Shape,
    Snapshot,
    Type,
    client_family,
)
from llmobs.export.metrics.native import ZERO_THRESHOLD, NativeBuckets
from llmobs.observe.window import TokenWindow


class HistogramRow:
    """One label set's series in several histogram families (a family may come twice, under
    different label values), each bound at its first observation, so series appear on
    /metrics in the order they were first recorded. Observing a whole row is one call, with
    no label lookup: what recording a request does."""

    __slots__ = ("_bounds", "_exemplars", "_members", "_natives", "_series")

    def __init__(self, members: Sequence[tuple[HistogramFamily, tuple[str, ...]]]) -> None:
        self._members = tuple(members)
        self._bounds = tuple(family.bounds for family, _ in self._members)
        self._series: list[list[Number] | None] = [None] * len(self._members)
        self._exemplars: list[list[Exemplar | None] | None] = [None] * len(self._members)
        self._natives: list[NativeBuckets | None] = [None] * len(self._members)

    def _bind(self, index: int) -> list[Number]:
        family, key = self._members[index]
        series = self._series[index] = family.series_for(key)
        self._natives[index] = family.natives.get(key)
        return series

    def observe_all(
        self, values: Sequence[Number | None], trace: tuple[str, str, float] | None = None
    ) -> None:
        """Count each value in the member of its position (None: not observed); ``values``
        may be shorter than the row. With ``trace`` (trace id, span id, unix time), each
        value is also its bucket's exemplar."""
        bound, bounds, natives = self._series, self._bounds, self._natives
        for index, value in enumerate(values):
            if value is not None:
                series = bound[index] or self._bind(index)
                series[bisect_left(bounds[index], value)] += 1
                series[-1] += value
                native = natives[index]
                if native is None:
                    continue
                # native.add(value), its usual case inline: a value in a bucket that exists
                octave = native.octave
                if octave and ZERO_THRESHOLD < value < inf:
                    frac, exp = frexp(value)
                    k = bisect_left(native.table, frac) + (exp - 1) * octave
                    positive = native.positive
                    before = positive.get(k)
                    if before is not None:
                        positive[k] = before + 1
                        continue
                native.add(value)
        if trace is not None:
            self._exemplify(values, trace)

    def _exemplify(self, values: Sequence[Number | None], trace: tuple[str, str, float]) -> None:
        """Each value as its bucket's exemplar: a loop of its own, so that an untraced
        request pays nothing for exemplars."""
        trace_id, span_id, at = trace
        bounds = self._bounds
        for index, value in enumerate(values):
            if value is not None:
                exemplars = self._exemplars[index]
                if exemplars is None:
                    family, key = self._members[index]
                    exemplars = self._exemplars[index] = family.exemplars_for(key)
                exemplars[bisect_left(bounds[index], value)] = (trace_id, span_id, float(value), at)


class HistogramFamily:
    """One histogram family: label values -> [count per bucket ..., +Inf count, sum]."""

    __slots__ = ("bounds", "exemplars", "layout", "metric", "natives", "series", "shape", "size")

    def __init__(self, metric: MetricDef) -> None:
        self.metric = metric
        self.shape = Shape.of(metric, Type.HISTOGRAM)
        self.bounds = self.shape.bounds
        self.size = self.shape.size  # index of the sum in a series
        self.series: dict[tuple[str, ...], list[Number]] = {}
        # label values -> the series' native buckets, kept next to the classic ones (same
        # observations; count and sum are the classic series'), if the metric has a layout
        self.layout = metric.native
        self.natives: dict[Key, NativeBuckets] = {}
        # label values -> one exemplar slot per bucket: made for a series at its first traced
        # observation (an untraced sidecar keeps none)
        self.exemplars: Exemplars = {}

    def _empty(self) -> list[Number]:
        return [0] * (self.size + 1)

    def series_for(self, key: tuple[str, ...]) -> list[Number]:
        """The series of ``key``, made (empty) if it has none yet: a caller that records into
        it often keeps the list and skips the lookup."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = self._empty()
            if self.layout is not None:
                self.natives[key] = NativeBuckets(self.layout)
        return series

    def natives_snapshot(self) -> Natives:
        """A copy of every series' native buckets (hold the lock)."""
        return {key: buckets.copy() for key, buckets in self.natives.items()}

    def exemplars_for(self, key: Key) -> list[Exemplar | None]:
        """The exemplar slots of ``key``'s series (one per bucket), made if it has none."""
        found = self.exemplars.get(key)
        if found is None:
            found = self.exemplars[key] = [None] * self.size
        return found

    def exemplars_snapshot(self) -> Exemplars:
        """A copy of every series' exemplars (hold the lock)."""
        return {key: list(slots) for key, slots in self.exemplars.items()}

    def sum_by(self, names: Sequence[str]) -> dict[Key, list[Number]]:
        """Every series' bucket counts (+Inf's last) and sum added up by the values of the
        labels ``names`` (the catalogue's): what a reader of totals needs, without knowing
        where a series keeps what (hold the lock)."""
        at = _positions(self.metric, names)
        out: dict[Key, list[Number]] = {}
        for key, series in self.series.items():
            group = tuple(key[i] for i in at)
            found = out.get(group)
            if found is None:
                out[group] = list(series)
            else:
                for i, value in enumerate(series):
                    found[i] += value
        return out

    def snapshot(self) -> Snapshot:
        """The label values of every series and all their numbers end to end (hold the lock).

        Two lists whatever the number of series: few objects for the garbage collector."""
        return list(self.series), list(chain.from_iterable(self.series.values()))

    def frame(self, exemplars: bool = False, natives: bool = False) -> Frame:
        """The family's series as a frame (hold the lock), with copies of their exemplars and
        native buckets if asked for."""
        keys, values = self.snapshot()
        found = self.exemplars_snapshot() if exemplars else None
        return Frame(self.shape, keys, values, found, self.natives_snapshot() if natives else None)


class CounterFamily:
    """A counter family (or a gauge: ``gauge=True``): label values -> value."""

    __slots__ = ("gauge", "metric", "series", "shape")

    def __init__(self, metric: MetricDef, *, gauge: bool = False) -> None:
        self.metric = metric
        self.gauge = gauge
        self.shape = Shape.of(metric, Type.GAUGE if gauge else Type.COUNTER)
        self.series: dict[tuple[str, ...], Number] = {}

    def add(self, key: tuple[str, ...], value: Number) -> None:
        series = self.series
        series[key] = series.get(key, 0) + value

    def sum_by(self, names: Sequence[str]) -> dict[Key, Number]:
        """Every series' value added up by the values of the labels ``names`` (the
        catalogue's; hold the lock)."""
        at = _positions(self.metric, names)
        out: dict[Key, Number] = {}
        for key, value in self.series.items():
            group = tuple(key[i] for i in at)
            out[group] = out.get(group, 0) + value
        return out

    def snapshot(self) -> Snapshot:
        """The label values of every series and their values (hold the lock)."""
        return list(self.series), list(self.series.values())

    def frame(self, exemplars: bool = False, natives: bool = False) -> Frame:
        """The family's series as a frame (hold the lock): counters carry no exemplars and
        no native buckets, whatever is asked."""
        keys, values = self.snapshot()
        return Frame(self.shape, keys, values)


class TokenHistogram:
    """Per-token ITL histogram recorded a window at a time, with its sum of squares.

    The counts of a window are added to the series like any other histogram's
    (``SeriesCollector`` exposes both families); the window bins itself into the classic and
    native buckets (``TokenWindow.classic_counts``, ``fill_native``).
    """

    __slots__ = ("_bounds", "histogram", "squares")

    def __init__(self, metric: MetricDef, squares: MetricDef) -> None:
        self.histogram = HistogramFamily(metric)
        self.squares = CounterFamily(squares)
        self._bounds = np.asarray(self.histogram.bounds, dtype=np.float64)

    def record(self, labels: tuple[str, ...], window: TokenWindow) -> None:
        """Add every ITL of ``window``, each ``weights[i]`` times (hold the collector's lock)."""
        if not len(window.values):
            return
        histogram = self.histogram
        series = histogram.series_for(labels)
        for bucket, count in window.classic_counts(histogram.bounds, self._bounds):
            series[bucket] += count
        series[-1] += window.itl_sum
        self.squares.add(labels, window.itl_sumsq)
        found = histogram.natives.get(labels)
        if found is not None:
            window.fill_native(found)

    def exemplar(self, labels: Key, value: float, trace: tuple[str, str, float]) -> None:
        """``trace`` as the exemplar of ``value``'s bucket (hold the collector's lock)."""
        histogram = self.histogram
        slots = histogram.exemplars_for(labels)
        trace_id, span_id, at = trace
        slots[bisect_left(histogram.bounds, value)] = (trace_id, span_id, float(value), at)


Family = HistogramFamily | CounterFamily


def _positions(metric: MetricDef, names: Sequence[str]) -> tuple[int, ...]:
    """Where the labels ``names`` are in a key of ``metric``'s series."""
    return tuple(metric.labels.index(name) for name in names)


class SeriesCollector(Collector):
    """Exposes ``families`` (in this order) from a prometheus_client registry: /metrics takes
    their frames (``frames``) for an encoder; ``collect`` gives prometheus_client's families,
    for readers of the registry.

    A family with no series yet is left out, as the OpenTelemetry exporter leaves out an
    instrument nothing was recorded into.
    """

    def __init__(self, families: Sequence[Family]) -> None:
        self.families = tuple(families)
        self.lock = threading.Lock()

    def frames(self, exemplars: bool = False, natives: bool = False) -> list[Frame]:
        """Every family's series at once, under the lock (a scrape never sees half a
        request), with the histograms' exemplars and native buckets if asked for."""
        with self.lock:
            return [f.frame(exemplars, natives) for f in self.families]

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's families, histogram buckets with their exemplars (which only
        the OpenMetrics exposition writes)."""
        for frame in self.frames(exemplars=True):
            if frame.keys:
                yield client_family(frame)

    def describe(self) -> Iterable[Metric]:
        return ()
