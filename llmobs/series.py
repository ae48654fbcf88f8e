"""Pre-bound Prometheus series: histograms and counters kept in plain Python lists.

Why not the OpenTelemetry SDK on this path: one ``Histogram.record()`` or ``Counter.add()``
costs ~9 us (attribute-set hashing, a lock and an aggregation object per call), and a request
makes ten of them; its Prometheus exporter then rebuilds every family from data points on each
scrape. Here a series is a list (bucket counts, then the sum) found by one dict lookup on a
tuple of label values; an observation is a ``bisect`` and two additions.

The exposition is what the OpenTelemetry Prometheus exporter wrote for the same instruments:
same family names and types, label names and values, ``le`` bounds (``repr`` of the float),
samples in the order their series first appeared, integer sums kept integers until rendered,
no ``_created`` samples. ``tests/test_exposition.py`` compares the two renderings byte for
byte, and ``tests/test_metrics.py`` holds a golden exposition.

/metrics does not go through ``collect``: at the label cap (32 models x 3 operations, ~1.3 MiB)
building prometheus_client's families and samples and formatting them with ``generate_latest``
takes 100-200 ms and allocates hundreds of thousands of tracked objects (dicts, tuples), whose
garbage collections pause the relay's event loop for tens of ms. ``SeriesCollector.render``
writes the same bytes directly: each series' text up to the value (name, ``{labels}`` escaped
and sorted, ``le``) is built once, the first time the series is rendered, and kept (series live
as long as the process); a scrape then only formats the values. ``exposition`` renders a whole
registry that way, other collectors with ``generate_latest``. ``tests/test_exposition.py``
checks both give the bytes ``generate_latest`` gives.

Thread safety: observations happen on the event loop, ``collect`` and ``render`` in the
/metrics rendering thread. Writers hold the owner's lock (``SeriesCollector.lock``) for a whole
request's updates, and a scrape copies every series under it (the lists only: counter values
are immutable numbers), so it never sees half a request.
"""

from __future__ import annotations

import asyncio
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from itertools import chain
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_go

if TYPE_CHECKING:
    from llmobs.metrics import MetricDef

Number = int | float
Key = tuple[str, ...]
# A family's series at a scrape: their label values, and their numbers (a histogram's buckets
# and sum, series after series).
Snapshot = tuple[list[Key], list[Number]]

# A sample's value as ``generate_latest`` writes it (Go's float formatting).
_go = cast(Callable[[Number], str], _untyped_go)


def _label_value(value: str) -> str:
    """A label value as ``generate_latest`` escapes it (backslash, newline, double quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(name: str, description: str, kind: str) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family, as ``generate_latest`` writes them."""
    doc = description.replace("\\", r"\\").replace("\n", r"\n")
    name = escape_metric_name(name)
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _prefix(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """A sample line up to its value: ``name{a="x",b="y"} `` (labels sorted by name)."""
    text = ",".join(f'{escape_label_name(k)}="{_label_value(v)}"' for k, v in sorted(labels))
    if not text:
        return f"{escape_metric_name(name)} "
    return f"{escape_metric_name(name)}{{{text}}} "


class HistogramFamily:
    """One histogram family: label values -> [count per bucket ..., +Inf count, sum]."""

    __slots__ = ("_edges", "_head", "_text", "bounds", "metric", "series", "size")

    def __init__(self, metric: MetricDef) -> None:
        self.metric = metric
        self.bounds = tuple(float(b) for b in metric.buckets)
        self.size = len(self.bounds) + 1  # index of the sum in a series
        self._edges = [repr(b) for b in self.bounds] + ["+Inf"]
        self.series: dict[tuple[str, ...], list[Number]] = {}
        self._head = _help(metric.prometheus, metric.description, "histogram")
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
        return series

    def observe(self, key: tuple[str, ...], value: Number) -> None:
        """Count ``value`` in its ``le`` bucket (as OpenTelemetry: ``bisect_left``)."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = self._empty()
        series[bisect_left(self.bounds, value)] += 1
        series[-1] += value

    def add_counts(self, key: tuple[str, ...], counts: Sequence[Number], total: Number) -> None:
        """Add pre-binned counts (one per bucket, +Inf last) and their sum."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = self._empty()
        for i, count in enumerate(counts):
            if count:
                series[i] += count
        series[-1] += total

    def snapshot(self) -> Snapshot:
        """The label values of every series and all their numbers end to end (hold the lock).

        Two lists whatever the number of series: few objects for the garbage collector."""
        return list(self.series), list(chain.from_iterable(self.series.values()))

    def family(self, snapshot: Snapshot) -> Metric:
        metric = self.metric
        out = HistogramMetricFamily(
            metric.prometheus, metric.description, labels=metric.prometheus_labels, unit=""
        )
        edges = self._edges
        size = self.size
        keys, values = snapshot
        for n, key in enumerate(keys):
            series = values[n * (size + 1) : (n + 1) * (size + 1)]
            buckets: list[tuple[str, float]] = []
            total: Number = 0
            for i in range(size):
                total += series[i]
                buckets.append((edges[i], total))
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

    def render(self, snapshot: Snapshot, out: list[str], start: int = 0, stop: int = -1) -> None:
        """Append the family's lines, as ``generate_latest(family(snapshot))`` writes them
        (series ``start`` to ``stop`` only, with the family's header if ``start`` is 0)."""
        keys, values = snapshot
        if not keys:
            return
        if start == 0:
            out.append(self._head)
        cache = self._text
        size = self.size
        go: dict[Number, str] = {}  # cumulative count -> text (counts repeat across buckets)
        j = start * (size + 1)
        for key in keys[start:stop] if stop >= 0 else keys[start:]:
            text = cache.get(key)
            if text is None:
                text = cache[key] = self._series_text(key)
            total: Number = 0
            for i in range(size):
                total += values[j]
                j += 1
                value = go.get(total)
                if value is None:
                    value = go[total] = _go(total)
                out.append(f"{text[i]}{value}\n")
            if len(text) > size:
                out.append(f"{text[size]}{value}\n{text[size + 1]}{_go(values[j])}\n")
            j += 1


class CounterFamily:
    """A counter family (or a gauge: ``gauge=True``): label values -> value."""

    __slots__ = ("_head", "_name", "_text", "gauge", "metric", "series")

    def __init__(self, metric: MetricDef, *, gauge: bool = False) -> None:
        self.metric = metric
        self.gauge = gauge
        self.series: dict[tuple[str, ...], Number] = {}
        # The sample name: a counter family is named without _total, its sample with it.
        self._name = metric.prometheus
        if not gauge:
            self._name = metric.prometheus.removesuffix("_total") + "_total"
        self._head = _help(self._name, metric.description, "gauge" if gauge else "counter")
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

    def render(self, snapshot: Snapshot, out: list[str], start: int = 0, stop: int = -1) -> None:
        """Append the family's lines, as ``generate_latest(family(snapshot))`` writes them
        (series ``start`` to ``stop`` only, with the family's header if ``start`` is 0)."""
        keys, values = snapshot
        if not keys:
            return
        if start == 0:
            out.append(self._head)
        cache = self._text
        end = len(keys) if stop < 0 else stop
        for key, value in zip(keys[start:end], values[start:end], strict=True):
            text = cache.get(key)
            if text is None:
                labels = zip(self.metric.prometheus_labels, key, strict=False)
                text = cache[key] = _prefix(self._name, dict(labels).items())
            out.append(f"{text}{_go(value)}\n")


Family = HistogramFamily | CounterFamily


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
        for family, snapshot in self._snapshot():
            if snapshot[0]:
                yield family.family(snapshot)

    def describe(self) -> Iterable[Metric]:
        return ()

    def render(self) -> str:
        """The families in the Prometheus text format: ``generate_latest(self)``, decoded."""
        out: list[str] = []
        for family, snapshot in self._snapshot():
            family.render(snapshot, out)
        return "".join(out)

    def render_parts(self, lines: int = 1000) -> Iterator[str]:
        """``render()`` in parts of about ``lines`` lines, from one snapshot taken at the
        first part: a caller on the event loop can let other tasks run between parts."""
        out: list[str] = []
        for family, snapshot in self._snapshot():
            per_series = family.size + 3 if isinstance(family, HistogramFamily) else 1
            step = max(1, lines // per_series)
            for start in range(0, len(snapshot[0]), step):
                family.render(snapshot, out, start, start + step)
                if len(out) >= lines:
                    yield "".join(out)
                    out.clear()
        if out:
            yield "".join(out)


def _members(registry: CollectorRegistry) -> list[Collector] | None:
    """The registry's collectors in order, or None where they cannot be listed."""
    collectors = getattr(registry, "_collector_to_names", None)
    lock = getattr(registry, "_lock", None)
    if collectors is None or lock is None or getattr(registry, "_target_info", None):
        return None
    with lock:
        return list(collectors)


async def exposition_async(registry: CollectorRegistry, executor: Executor) -> bytes:
    """``exposition(registry)`` with the series rendered on the event loop a part at a time,
    the other collectors in ``executor``."""
    loop = asyncio.get_running_loop()
    members = _members(registry)
    if members is None:
        return await loop.run_in_executor(executor, generate_latest, registry)
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            for part in collector.render_parts():
                parts.append(part.encode())
                await asyncio.sleep(0)
        else:
            parts.append(await loop.run_in_executor(executor, generate_latest, collector))
    return b"".join(parts)


def exposition(registry: CollectorRegistry) -> bytes:
    """``generate_latest(registry)``, with every ``SeriesCollector`` rendered by its ``render``.

    The collectors are rendered in the registry's order, so the families come in the order
    ``generate_latest`` gives them.
    """
    members = _members(registry)
    if members is None:
        return generate_latest(registry)  # a registry this does not know how to walk
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            parts.append(collector.render().encode())
        else:
            parts.append(generate_latest(collector))
    return b"".join(parts)
