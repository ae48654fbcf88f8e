"""Prometheus' protobuf exposition: ``io.prometheus.client.MetricFamily`` messages
(``client_model``), each length-delimited, the only format that carries native histograms.

prometheus_client for Python cannot write it (client_python #918), so this module does, with
the protobuf runtime that the OTLP exporters already depend on doing the encoding. ``parts``
encodes the request series' frames (``frames.Frame``), native buckets and exemplars included,
a few series at a time in parts that are concatenated: protobuf merges concatenated messages
of a type, appending repeated fields. ``family_bytes`` encodes a prometheus_client family (the
collectors other than the request series).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from math import inf
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.samples import Exemplar as ClientExemplar
from prometheus_client.samples import Sample

from llmobs.export.metrics import native
from llmobs.export.metrics.client_model import (
    COUNTER,
    GAUGE,
    GAUGE_HISTOGRAM,
    HISTOGRAM,
    SUMMARY,
    UNTYPED,
    LabelPair,
    MetricFamily,
)
from llmobs.export.metrics.frames import Exemplar, Frame, Number, Type

CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)
MEDIA_TYPE = "application/vnd.google.protobuf"
PROTO = "io.prometheus.client.MetricFamily"


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint: the length before each delimited message. (The
    runtime's encoder for it is private: ``google.protobuf.internal``.)"""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def part(name: str, help_: str, mtype: int, *, first: bool) -> Any:
    """A ``MetricFamily`` message for one part of a family's series: the first part names
    the family (its help and type too); the later ones merge into it."""
    if not first:
        return MetricFamily()
    return MetricFamily(name=name, help=help_, type=mtype)


def delimited(parts: Sequence[bytes]) -> bytes:
    """One message, serialized in ``parts`` (concatenation merges them), with its length
    before it: one entry of the delimited stream."""
    body = b"".join(parts)
    return varint(len(body)) + body


def exemplar(labels: dict[str, str], value: float, at: float | None, out: Any) -> None:
    """Fill ``out``, an ``Exemplar`` field, with an exemplar."""
    for name, text in labels.items():
        out.label.add(name=name, value=text)
    out.value = value
    if at is not None:
        seconds = math.floor(at)
        nanos = round((at - seconds) * 1e9)  # the fraction alone: at * 1e9 is past 2^53
        if nanos == 1_000_000_000:
            seconds, nanos = seconds + 1, 0
        out.timestamp.seconds = seconds
        out.timestamp.nanos = nanos


def labels_of(metric: Any, names: Sequence[str], values: Sequence[str]) -> None:
    """The label pairs of ``metric``, sorted by name (as Prometheus and the text format
    order them)."""
    for name, value in sorted(zip(names, values, strict=False)):
        metric.label.add(name=name, value=value)


# --- the request series' frames ---


def parts(frames: Iterable[Frame], series: int = 25) -> Iterator[bytes]:
    """Every family with a series as a delimited ``MetricFamily``, encoded ``series`` series
    at a time (frames made with their exemplars and native buckets); between two parts it
    yields b"" (a caller on the event loop lets other tasks run there)."""
    for frame in frames:
        encode = _histogram_part if frame.shape.type is Type.HISTOGRAM else _sample_part
        found: list[bytes] = []
        for start in range(0, len(frame.keys), series):
            found.append(encode(frame, start, start + series))
            yield b""
        if found:
            yield delimited(found)


def _sample_part(frame: Frame, start: int, stop: int) -> bytes:
    """A counter's or gauge's series ``start`` to ``stop`` as a serialized ``MetricFamily``
    (the family's name, help and type with the first)."""
    shape, keys, values = frame.shape, frame.keys, frame.values
    gauge = shape.type is Type.GAUGE
    out = part(shape.name, shape.help, GAUGE if gauge else COUNTER, first=start == 0)
    names = shape.labels
    end = len(keys) if stop < 0 else stop
    for key, value in zip(keys[start:end], values[start:end], strict=True):
        metric = out.metric.add()
        labels_of(metric, names, key)
        if gauge:
            metric.gauge.value = value
        else:
            metric.counter.value = value
    return bytes(out.SerializeToString())


def _histogram_part(frame: Frame, start: int, stop: int) -> bytes:
    """A histogram's series ``start`` to ``stop`` as a serialized ``MetricFamily`` (the
    family's name, help and type with the first): classic buckets (the +Inf one only to carry
    an exemplar, as client_golang writes it), with their exemplars, and the native buckets
    next to them, whose exemplars also go in the histogram's own list."""
    shape, keys, values = frame.shape, frame.keys, frame.values
    exemplars, natives = frame.exemplars, frame.natives
    out = part(shape.name, shape.help, HISTOGRAM, first=start == 0)
    names, size = shape.labels, shape.size
    j = start * (size + 1)
    for key in keys[start:stop] if stop >= 0 else keys[start:]:
        metric = out.metric.add()
        labels_of(metric, names, key)
        h = metric.histogram
        slots = exemplars.get(key) if exemplars else None
        h.sample_count = _classic(h, shape.bounds, values, j, slots)
        h.sample_sum = values[j + size]
        state = natives.get(key) if natives else None
        if state is not None:
            _native_fields(h, state, slots)
        j += size + 1
    return bytes(out.SerializeToString())


def _classic(
    h: Any,
    bounds: Sequence[float],
    values: Sequence[Number],
    j: int,
    slots: Sequence[Exemplar | None] | None,
) -> int:
    """The classic buckets of the series whose counts start at ``values[j]`` into ``h``, with
    their exemplars; returns its count."""
    total: Number = 0
    for i, bound in enumerate(bounds):
        total += values[j + i]
        bucket = h.bucket.add(cumulative_count=int(total), upper_bound=bound)
        if slots is not None and (found := slots[i]) is not None:
            _exemplar(found, bucket.exemplar)
    last = len(bounds)
    total += values[j + last]
    if slots is not None and (found := slots[last]) is not None:
        _exemplar(found, h.bucket.add(cumulative_count=int(total), upper_bound=inf).exemplar)
    return int(total)


def _native_fields(h: Any, state: native.Snapshot, slots: Sequence[Exemplar | None] | None) -> None:
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
            _exemplar(found, h.exemplars.add())


def _exemplar(found: Exemplar, out: Any) -> None:
    """A bucket's exemplar into ``out``, a protobuf ``Exemplar`` field."""
    trace_id, span_id, value, at = found
    exemplar({"trace_id": trace_id, "span_id": span_id}, value, at, out)


# --- prometheus_client's families (every collector but the request series) ---


def _client_exemplar(found: ClientExemplar | None, out: Any) -> None:
    if found is not None:
        at = found.timestamp
        seconds = at if isinstance(at, float | int) or at is None else float(at.sec + at.nsec / 1e9)
        exemplar(dict(found.labels), found.value, seconds, out)


def _group(samples: Iterable[Sample], drop: str) -> dict[tuple[tuple[str, str], ...], list[Sample]]:
    """Samples by label set without ``drop`` (``le``, ``quantile``), in order of appearance."""
    out: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
    for sample in samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != drop))
        out.setdefault(key, []).append(sample)
    return out


def _histogram(name: str, samples: list[Sample], gauge: bool, out: Any) -> None:
    count_name, sum_name = (
        (f"{name}_gcount", f"{name}_gsum") if gauge else (f"{name}_count", f"{name}_sum")
    )
    h = out.histogram
    for sample in samples:
        if sample.name == f"{name}_bucket":
            bound = float(sample.labels["le"])
            if bound == float("inf") and sample.exemplar is None:
                continue  # the sample count says it; written only to carry an exemplar
            bucket = h.bucket.add(cumulative_count=int(sample.value), upper_bound=bound)
            _client_exemplar(sample.exemplar, bucket.exemplar)
        elif sample.name == count_name:
            h.sample_count = int(sample.value)
        elif sample.name == sum_name:
            h.sample_sum = sample.value


def _summary(name: str, samples: list[Sample], out: Any) -> None:
    s = out.summary
    for sample in samples:
        if sample.name == f"{name}_count":
            s.sample_count = int(sample.value)
        elif sample.name == f"{name}_sum":
            s.sample_sum = sample.value
        elif sample.name == name and "quantile" in sample.labels:
            s.quantile.add(quantile=float(sample.labels["quantile"]), value=sample.value)


_TYPES = {
    "counter": COUNTER, "gauge": GAUGE, "info": GAUGE, "stateset": GAUGE,
    "histogram": HISTOGRAM, "gaugehistogram": GAUGE_HISTOGRAM, "summary": SUMMARY,
}  # fmt: skip
_NAMED = {"counter": "_total", "info": "_info"}  # the sample name's suffix, as the text has it


def _sample(sample: Sample, mtype: int, out: Any) -> None:
    """A counter's, gauge's or untyped family's one sample of a label set."""
    if sample.timestamp is not None:
        out.timestamp_ms = int(float(sample.timestamp) * 1000)
    if mtype == COUNTER:
        out.counter.value = sample.value
        _client_exemplar(sample.exemplar, out.counter.exemplar)
    elif mtype == GAUGE:
        out.gauge.value = sample.value
    else:
        out.untyped.value = sample.value


def family_bytes(family: Metric) -> bytes:
    """A prometheus_client family as one delimited ``MetricFamily`` (b"" if it has no
    samples). Its series are what the text format shows, but for ``_created`` samples
    (Prometheus does not ingest them from protobuf: they would be ``created_timestamp``)."""
    name = family.name + _NAMED.get(family.type, "")
    mtype = _TYPES.get(family.type, UNTYPED)
    out = MetricFamily(name=name, help=family.documentation, type=mtype)
    if family.unit:
        out.unit = family.unit
    # the label that tells a family's samples apart within one series: none but these two
    drop = {HISTOGRAM: "le", GAUGE_HISTOGRAM: "le", SUMMARY: "quantile"}.get(mtype, "")
    for key, samples in _group(family.samples, drop).items():
        labels = [LabelPair(name=k, value=v) for k, v in key]
        if mtype == SUMMARY:
            _summary(family.name, samples, out.metric.add(label=labels))
        elif mtype in (HISTOGRAM, GAUGE_HISTOGRAM):
            gauge = mtype == GAUGE_HISTOGRAM
            _histogram(family.name, samples, gauge, out.metric.add(label=labels))
        else:
            for sample in samples:
                if sample.name == name or not sample.name.endswith("_created"):
                    _sample(sample, mtype, out.metric.add(label=labels))
    if not out.metric:
        return b""
    return delimited([out.SerializeToString()])
