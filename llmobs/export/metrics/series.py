"""The families of series: histograms and counters kept in plain Python lists.

The only code that knows a series' layout (a histogram's bucket counts, then its sum): the
sink records through a handle bound once per label set (``HistogramRow``, as
prometheus_client's ``.labels()`` child, for a request's several histograms at once), the
renderer reads snapshots.

Why not the OpenTelemetry SDK on this path: one ``Histogram.record()`` or ``Counter.add()``
costs ~9 us (attribute-set hashing, a lock and an aggregation object per call), and a request
makes ten of them; its Prometheus exporter then rebuilds every family from data points on each
scrape. Here a series is a list (bucket counts, then the sum) found by one dict lookup on a
tuple of label values; an observation is a ``bisect`` and two additions.

The exposition is what the OpenTelemetry Prometheus exporter wrote for the same instruments:
same family names and types, label names and values, ``le`` bounds (``repr`` of the float),
samples in the order their series first appeared, integer sums kept integers until rendered,
no ``_created`` samples. ``tests/unit/export/metrics/test_exposition.py`` compares the two
renderings byte for byte, and ``tests/unit/export/metrics/test_sink.py`` holds a golden exposition.

/metrics does not go through ``collect``: at the label cap (32 models x 3 operations, ~1.3 MiB)
building prometheus_client's families and samples and formatting them with ``generate_latest``
takes 100-200 ms and allocates hundreds of thousands of tracked objects (dicts, tuples), whose
garbage collections pause the relay's event loop for tens of ms. ``SeriesCollector.render``
writes the same bytes directly: each series' text up to the value (name, ``{labels}`` escaped
and sorted, ``le``) is built once, the first time the series is rendered, and kept (series live
as long as the process); a scrape then only formats the values (``exposition`` puts a whole
registry together). ``tests/unit/export/metrics/test_exposition.py`` checks both give the bytes
``generate_latest`` gives.

Thread safety: observations happen on the event loop, ``collect`` and ``render`` in the
/metrics rendering thread. Writers hold the owner's lock (``SeriesCollector.lock``) for a whole
request's updates, and a scrape copies every series under it (the lists only: counter values
are immutable numbers), so it never sees half a request. A label-less series (a gauge's one
number, its key there from the start) is written by the loop alone without the lock: a scrape
reads its old value or its new one.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from math import frexp, inf
from typing import Any, cast

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar as ClientExemplar
from prometheus_client.utils import floatToGoString as _untyped_go

from llmobs.export.metrics import native, protobuf
from llmobs.export.metrics.catalogue import MetricDef
from llmobs.export.metrics.native import ZERO_THRESHOLD, NativeBuckets
from llmobs.observe.stats import TokenWindow

Number = int | float
Key = tuple[str, ...]
# A family's series at a scrape: their label values, and their numbers (a histogram's buckets
# and sum, series after series).
Snapshot = tuple[list[Key], list[Number]]
# A bucket's exemplar: the trace and span of a request that fell into it, the value observed,
# and when (unix seconds). At most one per bucket, the latest (OpenMetrics keeps one per line).
Exemplar = tuple[str, str, float, float]
Exemplars = dict[Key, list[Exemplar | None]]

# A sample's value as ``generate_latest`` writes it (Go's float formatting).
_go = cast(Callable[[Number], str], _untyped_go)
_openmetrics = cast(Callable[[Collector], bytes], openmetrics_latest)


def _label_value(value: str) -> str:
    """A label value as ``generate_latest`` escapes it (backslash, newline, double quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(name: str, description: str, kind: str) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family, as ``generate_latest`` writes them."""
    doc = description.replace("\\", r"\\").replace("\n", r"\n")
    name = escape_metric_name(name)
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


class _Empty(Collector):
    """One family with no samples: what the OpenMetrics writer gives for it is its header."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return (self._family,)


def _openmetrics_head(family: Metric) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of ``family`` as the OpenMetrics writer of
    prometheus_client writes them (a counter is named without ``_total`` there)."""
    return _openmetrics(_Empty(family)).decode().removesuffix("# EOF\n")


def _exemplar_text(found: Exemplar) -> str:
    """A bucket line's exemplar, as prometheus_client's OpenMetrics writer writes one."""
    trace_id, span_id, value, at = found
    return f' # {{span_id="{span_id}",trace_id="{trace_id}"}} {_go(value)} {at}'


def _prefix(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """A sample line up to its value: ``name{a="x",b="y"} `` (labels sorted by name)."""
    text = ",".join(f'{escape_label_name(k)}="{_label_value(v)}"' for k, v in sorted(labels))
    if not text:
        return f"{escape_metric_name(name)} "
    return f"{escape_metric_name(name)}{{{text}}} "


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

    __slots__ = (
        "_edges", "_head", "_om_head", "_text", "bounds", "exemplars", "layout", "metric",
        "natives", "series", "size",
    )  # fmt: skip

    def __init__(self, metric: MetricDef) -> None:
        self.metric = metric
        self.bounds = tuple(float(b) for b in metric.buckets)
        self.size = len(self.bounds) + 1  # index of the sum in a series
        self._edges = [repr(b) for b in self.bounds] + ["+Inf"]
        self.series: dict[tuple[str, ...], list[Number]] = {}
        # label values -> the series' native buckets, kept next to the classic ones (same
        # observations; count and sum are the classic series'), if the metric has a layout
        self.layout = metric.native
        self.natives: dict[Key, NativeBuckets] = {}
        # label values -> one exemplar slot per bucket: made for a series at its first traced
        # observation (an untraced sidecar keeps none)
        self.exemplars: Exemplars = {}
        self._head = _help(metric.prometheus, metric.description, "histogram")
        self._om_head = _openmetrics_head(self.family(([], [])))
        # label values -> the text of each bucket line, then _count and _sum, up to the value
        self._text: dict[Key, tuple[str, ...]] = {}

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

    def natives_snapshot(self) -> dict[Key, native.Snapshot]:
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

    def observe(self, key: tuple[str, ...], value: Number) -> None:
        """Count ``value`` in the series of ``key`` (a caller that observes the same series
        often binds them once in a ``HistogramRow``)."""
        series = self.series_for(key)
        series[bisect_left(self.bounds, value)] += 1
        series[-1] += value
        found = self.natives.get(key)
        if found is not None:
            found.add(value)

    def snapshot(self) -> Snapshot:
        """The label values of every series and all their numbers end to end (hold the lock).

        Two lists whatever the number of series: few objects for the garbage collector."""
        return list(self.series), list(chain.from_iterable(self.series.values()))

    def family(self, snapshot: Snapshot, exemplars: Exemplars | None = None) -> Metric:
        """prometheus_client's family of ``snapshot``, each bucket with its exemplar (if
        ``exemplars`` has one: the OpenMetrics exposition shows them)."""
        metric = self.metric
        out = HistogramMetricFamily(
            metric.prometheus, metric.description, labels=metric.prometheus_labels, unit=""
        )
        edges = self._edges
        size = self.size
        keys, values = snapshot
        for n, key in enumerate(keys):
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

    def _series_text(self, key: Key) -> tuple[str, ...]:
        """Each bucket line up to its value, then the _count and _sum lines (if any)."""
        name = escape_metric_name(self.metric.prometheus)
        labels = dict(zip(self.metric.prometheus_labels, key, strict=False))
        if "le" in labels:  # generate_latest's le replaces it
            text = [_prefix(f"{name}_bucket", {**labels, "le": e}.items()) for e in self._edges]
        else:  # the labels sorted by name, le among them
            pairs = [(k, f'{escape_label_name(k)}="{_label_value(v)}"') for k, v in labels.items()]
            pairs.sort()
            head = "".join(f"{text}," for k, text in pairs if k < "le")
            tail = "".join(f",{text}" for k, text in pairs if k > "le")
            text = [f'{name}_bucket{{{head}le="{e}"{tail}}} ' for e in self._edges]
        if self.bounds and self.bounds[0] < 0:  # no _count, _sum with negative buckets
            return tuple(text)
        pairs_ = labels.items()
        return (*text, _prefix(f"{name}_count", pairs_), _prefix(f"{name}_sum", pairs_))

    def render(
        self,
        snapshot: Snapshot,
        out: list[str],
        start: int = 0,
        stop: int = -1,
        exemplars: Exemplars | None = None,
    ) -> None:
        """Append the family's lines, as ``generate_latest(family(snapshot))`` writes them
        (series ``start`` to ``stop`` only, with the family's header if ``start`` is 0); with
        ``exemplars`` (a dict, maybe empty), as the OpenMetrics writer writes
        ``family(snapshot, exemplars)``: the lines are the same but for the header and the
        exemplars after the bucket lines that have one."""
        keys, values = snapshot
        if not keys:
            return
        if start == 0:
            out.append(self._head if exemplars is None else self._om_head)
        cache = self._text
        size = self.size
        go: dict[Number, str] = {}  # cumulative count -> text (counts repeat across buckets)
        j = start * (size + 1)
        for key in keys[start:stop] if stop >= 0 else keys[start:]:
            text = cache.get(key)
            if text is None:
                text = cache[key] = self._series_text(key)
            slots = exemplars.get(key) if exemplars else None
            total: Number = 0
            for i in range(size):
                total += values[j]
                j += 1
                value = go.get(total)
                if value is None:
                    value = go[total] = _go(total)
                if slots is not None and (found := slots[i]) is not None:
                    out.append(f"{text[i]}{value}{_exemplar_text(found)}\n")
                else:
                    out.append(f"{text[i]}{value}\n")
            if len(text) > size:
                out.append(f"{text[size]}{value}\n{text[size + 1]}{_go(values[j])}\n")
            j += 1

    def proto(
        self,
        snapshot: Snapshot,
        start: int,
        stop: int,
        exemplars: Exemplars | None = None,
        natives: dict[Key, native.Snapshot] | None = None,
    ) -> bytes:
        """Series ``start`` to ``stop`` as a serialized ``MetricFamily`` (the family's name,
        help and type with the first): classic buckets (the +Inf one only to carry an
        exemplar, as client_golang writes it), with their exemplars, and the native buckets
        next to them (``natives``), whose exemplars also go in the histogram's own list."""
        keys, values = snapshot
        out = protobuf.part(self.metric.prometheus, self.metric.description, protobuf.HISTOGRAM,
                            first=start == 0)  # fmt: skip
        names = self.metric.prometheus_labels
        bounds, size = self.bounds, self.size
        j = start * (size + 1)
        for key in keys[start:stop] if stop >= 0 else keys[start:]:
            metric = out.metric.add()
            protobuf.labels_of(metric, names, key)
            h = metric.histogram
            slots = exemplars.get(key) if exemplars else None
            total: Number = 0
            for i in range(size):
                total += values[j + i]
                found = slots[i] if slots is not None else None
                if i < size - 1:
                    bucket = h.bucket.add(cumulative_count=int(total), upper_bound=bounds[i])
                elif found is not None:
                    bucket = h.bucket.add(cumulative_count=int(total), upper_bound=inf)
                if found is not None:
                    _proto_exemplar(found, bucket.exemplar)
            h.sample_count = int(total)
            h.sample_sum = values[j + size]
            state = natives.get(key) if natives else None
            if state is not None:
                _native_fields(h, state, slots)
            j += size + 1
        return bytes(out.SerializeToString())


def _native_fields(h: Any, state: native.Snapshot, slots: list[Exemplar | None] | None) -> None:
    """A histogram message's native buckets (always with the zero threshold, which is what
    marks it native to Prometheus 2.x), and the exemplars of its classic buckets in its own
    list (where Prometheus 3 looks for a native histogram's)."""
    h.schema = state.schema
    h.zero_threshold = native.ZERO_THRESHOLD
    h.zero_count = state.zero
    for buckets, spans_field, deltas_field in (
        (state.positive, h.positive_span, h.positive_delta),
        (state.negative, h.negative_span, h.negative_delta),
    ):
        if buckets:
            found_spans, deltas = native.spans(buckets)
            for offset, length in found_spans:
                spans_field.add(offset=offset, length=length)
            deltas_field.extend(deltas)
    if not state.positive and not state.negative and not state.zero:
        h.positive_span.add(offset=0, length=0)  # client_golang's mark of an empty one
    for found in slots or ():
        if found is not None:
            _proto_exemplar(found, h.exemplars.add())


def _proto_exemplar(found: Exemplar, out: Any) -> None:
    """A bucket's exemplar into ``out``, a protobuf ``Exemplar`` field."""
    trace_id, span_id, value, at = found
    protobuf.exemplar({"trace_id": trace_id, "span_id": span_id}, value, at, out)


class CounterFamily:
    """A counter family (or a gauge: ``gauge=True``): label values -> value."""

    __slots__ = ("_head", "_name", "_om_head", "_text", "gauge", "metric", "series")

    def __init__(self, metric: MetricDef, *, gauge: bool = False) -> None:
        self.metric = metric
        self.gauge = gauge
        self.series: dict[tuple[str, ...], Number] = {}
        # The sample name: a counter family is named without _total, its sample with it.
        self._name = metric.prometheus
        if not gauge:
            self._name = metric.prometheus.removesuffix("_total") + "_total"
        self._head = _help(self._name, metric.description, "gauge" if gauge else "counter")
        self._om_head = _openmetrics_head(self.family(([], [])))
        self._text: dict[Key, str] = {}  # label values -> the sample's line up to the value

    def add(self, key: tuple[str, ...], value: Number) -> None:
        series = self.series
        series[key] = series.get(key, 0) + value

    def snapshot(self) -> Snapshot:
        """The label values of every series and their values (hold the lock)."""
        return list(self.series), list(self.series.values())

    def family(self, snapshot: Snapshot) -> Metric:
        metric = self.metric
        out: CounterMetricFamily | GaugeMetricFamily
        if self.gauge:
            out = GaugeMetricFamily(
                metric.prometheus, metric.description, labels=metric.prometheus_labels
            )
        else:
            name = metric.prometheus.removesuffix("_total")
            out = CounterMetricFamily(name, metric.description, labels=metric.prometheus_labels)
        for key, value in zip(*snapshot, strict=True):
            out.add_metric(key, value)
        return out

    def render(
        self,
        snapshot: Snapshot,
        out: list[str],
        start: int = 0,
        stop: int = -1,
        exemplars: Exemplars | None = None,
    ) -> None:
        """Append the family's lines, as ``generate_latest(family(snapshot))`` writes them
        (series ``start`` to ``stop`` only, with the family's header if ``start`` is 0); with
        ``exemplars`` (counters carry none), as the OpenMetrics writer does: another header."""
        keys, values = snapshot
        if not keys:
            return
        if start == 0:
            out.append(self._head if exemplars is None else self._om_head)
        cache = self._text
        end = len(keys) if stop < 0 else stop
        for key, value in zip(keys[start:end], values[start:end], strict=True):
            text = cache.get(key)
            if text is None:
                labels = zip(self.metric.prometheus_labels, key, strict=False)
                text = cache[key] = _prefix(self._name, dict(labels).items())
            out.append(f"{text}{_go(value)}\n")

    def proto(
        self,
        snapshot: Snapshot,
        start: int,
        stop: int,
        exemplars: Exemplars | None = None,
        natives: dict[Key, native.Snapshot] | None = None,
    ) -> bytes:
        """Series ``start`` to ``stop`` as a serialized ``MetricFamily`` (the family's name,
        help and type with the first)."""
        keys, values = snapshot
        kind = protobuf.GAUGE if self.gauge else protobuf.COUNTER
        out = protobuf.part(self._name, self.metric.description, kind, first=start == 0)
        names = self.metric.prometheus_labels
        end = len(keys) if stop < 0 else stop
        for key, value in zip(keys[start:end], values[start:end], strict=True):
            metric = out.metric.add()
            protobuf.labels_of(metric, names, key)
            if self.gauge:
                metric.gauge.value = value
            else:
                metric.counter.value = value
        return bytes(out.SerializeToString())


class TokenHistogram:
    """Per-token ITL histogram recorded a window at a time, with its sum of squares.

    The counts of a window are added to the series like any other histogram's
    (``SeriesCollector`` exposes both families). Whole numbers of tokens as floats, as numpy's
    ``bincount`` gives them, whichever way they are binned: a large window with numpy in one
    call; a window whose ITLs are sorted (one token per chunk) a bucket at a time, by bisection,
    which is a few steps for a steady stream; a small unsorted one value by value.
    """

    __slots__ = ("_bounds", "histogram", "squares")

    def __init__(self, metric: MetricDef, squares: MetricDef) -> None:
        self.histogram = HistogramFamily(metric)
        self.squares = CounterFamily(squares)
        self._bounds = np.asarray(self.histogram.bounds, dtype=np.float64)

    def record(self, labels: tuple[str, ...], window: TokenWindow) -> None:
        """Add every ITL of ``window``, each ``weights[i]`` times (hold the collector's lock)."""
        values = window.values
        if len(values) == 0:
            return
        series = self.histogram.series_for(labels)
        ordered = window.ordered
        if ordered is None:
            self._bin(series, window)
        elif isinstance(ordered, list):
            self._bin_sorted_list(series, ordered)
        else:
            self._bin_sorted_array(series, ordered)
        series[-1] += window.itl_sum
        self.squares.add(labels, window.itl_sumsq)
        found = self.histogram.natives.get(labels)
        if found is not None:
            _native_window(found, window)

    def exemplar(self, labels: Key, value: float, trace: tuple[str, str, float]) -> None:
        """``trace`` as the exemplar of ``value``'s bucket (hold the collector's lock)."""
        histogram = self.histogram
        slots = histogram.exemplars_for(labels)
        trace_id, span_id, at = trace
        slots[bisect_left(histogram.bounds, value)] = (trace_id, span_id, float(value), at)

    def _bin_sorted_list(self, series: list[Number], ordered: list[float]) -> None:
        """Ascending ITLs of one token each, a run of values in one bucket at a time."""
        bounds = self.histogram.bounds
        top, n, i = len(bounds), len(ordered), 0
        while i < n:
            b = bisect_left(bounds, ordered[i])
            j = bisect_right(ordered, bounds[b], i) if b < top else n
            series[b] += float(j - i)
            i = j

    def _bin_sorted_array(self, series: list[Number], ordered: np.ndarray) -> None:
        """Ascending ITLs of one token each (numpy): the values at or below each bound
        between the first value's bucket and the last's."""
        bounds = self.histogram.bounds
        lo = bisect_left(bounds, float(ordered[0]))
        hi = bisect_left(bounds, float(ordered[-1]))
        done = 0
        if hi > lo:
            below = np.searchsorted(ordered, self._bounds[lo:hi], side="right").tolist()
            for b, count in enumerate(below, lo):
                if count != done:
                    series[b] += float(count - done)
                    done = count
        if len(ordered) != done:
            series[hi] += float(len(ordered) - done)

    def _bin(self, series: list[Number], window: TokenWindow) -> None:
        """ITLs in chunk order, weighted: value by value (plain Python), or numpy's bincount."""
        values = window.values
        bounds = self.histogram.bounds
        if isinstance(values, list):
            counts = window.counts
            if counts is None:
                for value in values:
                    series[bisect_left(bounds, value)] += 1.0
            else:
                for value, count in zip(values, counts, strict=True):
                    series[bisect_left(bounds, value)] += count
            return
        index = np.searchsorted(self._bounds, values, side="left")
        binned = np.bincount(index, weights=window.weights, minlength=self._bounds.size + 1)
        for i, count in enumerate(binned.tolist()):
            if count:
                series[i] += count


def _native_window(buckets: NativeBuckets, window: TokenWindow) -> None:
    """A window's ITLs into native buckets, the way its classic binning goes: sorted runs, a
    list value by value, or numpy."""
    ordered = window.ordered
    if isinstance(ordered, list):
        buckets.add_sorted(ordered)
        return
    if ordered is not None:
        buckets.add_array(ordered)
        return
    values, counts = window.values, window.counts
    if not isinstance(values, list):
        buckets.add_array(values, window.weights if counts is not None else None)
    elif counts is None:
        for value in values:
            buckets.add(value)
    else:
        for value, count in zip(values, counts, strict=True):
            buckets.add(value, round(count))


Family = HistogramFamily | CounterFamily


def _exemplars_of(family: Family) -> Exemplars | None:
    return family.exemplars_snapshot() if isinstance(family, HistogramFamily) else None


class SeriesCollector(Collector):
    """Exposes ``families`` (in this order) from a prometheus_client registry.

    A family with no series yet is left out, as the OpenTelemetry exporter leaves out an
    instrument nothing was recorded into.
    """

    def __init__(self, families: Sequence[Family]) -> None:
        self.families = tuple(families)
        self.lock = threading.Lock()

    def _snapshot(self) -> list[tuple[Family, Snapshot]]:
        with self.lock:
            return [(f, f.snapshot()) for f in self.families]

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's families, histogram buckets with their exemplars (which only
        the OpenMetrics exposition writes)."""
        with self.lock:
            taken = [
                (
                    f,
                    f.snapshot(),
                    _exemplars_of(f),
                )
                for f in self.families
            ]
        for family, snapshot, exemplars in taken:
            if not snapshot[0]:
                continue
            if isinstance(family, HistogramFamily):
                yield family.family(snapshot, exemplars)
            else:
                yield family.family(snapshot)

    def describe(self) -> Iterable[Metric]:
        return ()

    def render(self) -> str:
        """The families in the Prometheus text format: ``generate_latest(self)``, decoded."""
        out: list[str] = []
        for family, snapshot in self._snapshot():
            family.render(snapshot, out)
        return "".join(out)

    def proto_parts(self, series: int = 25) -> Iterator[bytes]:
        """Every family as a delimited ``MetricFamily``, from one snapshot, a family made
        ``series`` series at a time; between two parts it yields b"" (a caller on the event
        loop lets other tasks run there)."""
        with self.lock:
            taken = [
                (
                    f,
                    f.snapshot(),
                    _exemplars_of(f) or {},
                    f.natives_snapshot() if isinstance(f, HistogramFamily) else None,
                )
                for f in self.families
            ]
        for family, snapshot, exemplars, natives in taken:
            parts: list[bytes] = []
            for start in range(0, len(snapshot[0]), series):
                parts.append(family.proto(snapshot, start, start + series, exemplars, natives))
                yield b""
            if parts:
                yield protobuf.delimited(parts)

    def render_parts(self, lines: int = 1000, openmetrics: bool = False) -> Iterator[str]:
        """``render()`` in parts of about ``lines`` lines, from one snapshot taken at the
        first part: a caller on the event loop can let other tasks run between parts. With
        ``openmetrics``, the families as the OpenMetrics writer writes ``collect()``'s, with
        their exemplars (without the closing ``# EOF``)."""
        out: list[str] = []
        with self.lock:
            taken = [
                (f, f.snapshot(), (_exemplars_of(f) or {}) if openmetrics else None)
                for f in self.families
            ]
        for family, snapshot, exemplars in taken:
            per_series = family.size + 3 if isinstance(family, HistogramFamily) else 1
            step = max(1, lines // per_series)
            for start in range(0, len(snapshot[0]), step):
                family.render(snapshot, out, start, start + step, exemplars)
                if len(out) >= lines:
                    yield "".join(out)
                    out.clear()
        if out:
            yield "".join(out)
