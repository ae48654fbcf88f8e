"""Prometheus' protobuf exposition: ``io.prometheus.client.MetricFamily`` messages, each
length-delimited, the only format that carries native histograms.

prometheus_client for Python cannot write it (client_python #918), so this module does, with
the protobuf runtime that the OTLP exporters already depend on doing the encoding. The message
classes are built at import from ``_SCHEMA``, a transcription of client_model's
``io/prometheus/client/metrics.proto`` (proto2): generated ``_pb2`` code pins the protobuf
runtime to the version that generated it, and a descriptor built here works with any runtime
from 5.x on. ``tests/unit/export/metrics/test_protobuf.py`` compiles the real ``metrics.proto`` and
checks every message, field number and type against this one.

``family_bytes`` turns a prometheus_client family (the collectors other than the request
series) into a message; the request series write theirs (``series``), in parts that are
concatenated: protobuf merges concatenated messages of a type, appending repeated fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from prometheus_client.core import Metric
from prometheus_client.samples import Exemplar as ClientExemplar
from prometheus_client.samples import Sample

CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)
MEDIA_TYPE = "application/vnd.google.protobuf"
PROTO = "io.prometheus.client.MetricFamily"

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_TS = ".google.protobuf.Timestamp"
# message -> its fields: (name, number, label, type, message type name or None)
_SCHEMA: dict[str, tuple[tuple[str, int, int, int, str | None], ...]] = {
    "LabelPair": (
        ("name", 1, _OPT, _F.TYPE_STRING, None),
        ("value", 2, _OPT, _F.TYPE_STRING, None),
    ),
    "Gauge": (("value", 1, _OPT, _F.TYPE_DOUBLE, None),),
    "Counter": (
        ("value", 1, _OPT, _F.TYPE_DOUBLE, None),
        ("exemplar", 2, _OPT, _F.TYPE_MESSAGE, "Exemplar"),
        ("created_timestamp", 3, _OPT, _F.TYPE_MESSAGE, _TS),
    ),
    "Quantile": (
        ("quantile", 1, _OPT, _F.TYPE_DOUBLE, None),
        ("value", 2, _OPT, _F.TYPE_DOUBLE, None),
    ),
    "Summary": (
        ("sample_count", 1, _OPT, _F.TYPE_UINT64, None),
        ("sample_sum", 2, _OPT, _F.TYPE_DOUBLE, None),
        ("quantile", 3, _REP, _F.TYPE_MESSAGE, "Quantile"),
        ("created_timestamp", 4, _OPT, _F.TYPE_MESSAGE, _TS),
    ),
    "Untyped": (("value", 1, _OPT, _F.TYPE_DOUBLE, None),),
    "Histogram": (
        ("sample_count", 1, _OPT, _F.TYPE_UINT64, None),
        ("sample_count_float", 4, _OPT, _F.TYPE_DOUBLE, None),
        ("sample_sum", 2, _OPT, _F.TYPE_DOUBLE, None),
        ("bucket", 3, _REP, _F.TYPE_MESSAGE, "Bucket"),
        ("created_timestamp", 15, _OPT, _F.TYPE_MESSAGE, _TS),
        ("schema", 5, _OPT, _F.TYPE_SINT32, None),
        ("zero_threshold", 6, _OPT, _F.TYPE_DOUBLE, None),
        ("zero_count", 7, _OPT, _F.TYPE_UINT64, None),
        ("zero_count_float", 8, _OPT, _F.TYPE_DOUBLE, None),
        ("negative_span", 9, _REP, _F.TYPE_MESSAGE, "BucketSpan"),
        ("negative_delta", 10, _REP, _F.TYPE_SINT64, None),
        ("negative_count", 11, _REP, _F.TYPE_DOUBLE, None),
        ("positive_span", 12, _REP, _F.TYPE_MESSAGE, "BucketSpan"),
        ("positive_delta", 13, _REP, _F.TYPE_SINT64, None),
        ("positive_count", 14, _REP, _F.TYPE_DOUBLE, None),
        ("exemplars", 16, _REP, _F.TYPE_MESSAGE, "Exemplar"),
    ),
    "Bucket": (
        ("cumulative_count", 1, _OPT, _F.TYPE_UINT64, None),
        ("cumulative_count_float", 4, _OPT, _F.TYPE_DOUBLE, None),
        ("upper_bound", 2, _OPT, _F.TYPE_DOUBLE, None),
        ("exemplar", 3, _OPT, _F.TYPE_MESSAGE, "Exemplar"),
    ),
    "BucketSpan": (
        ("offset", 1, _OPT, _F.TYPE_SINT32, None),
        ("length", 2, _OPT, _F.TYPE_UINT32, None),
    ),
    "Exemplar": (
        ("label", 1, _REP, _F.TYPE_MESSAGE, "LabelPair"),
        ("value", 2, _OPT, _F.TYPE_DOUBLE, None),
        ("timestamp", 3, _OPT, _F.TYPE_MESSAGE, _TS),
    ),
    "Metric": (
        ("label", 1, _REP, _F.TYPE_MESSAGE, "LabelPair"),
        ("gauge", 2, _OPT, _F.TYPE_MESSAGE, "Gauge"),
        ("counter", 3, _OPT, _F.TYPE_MESSAGE, "Counter"),
        ("summary", 4, _OPT, _F.TYPE_MESSAGE, "Summary"),
        ("untyped", 5, _OPT, _F.TYPE_MESSAGE, "Untyped"),
        ("histogram", 7, _OPT, _F.TYPE_MESSAGE, "Histogram"),
        ("timestamp_ms", 6, _OPT, _F.TYPE_INT64, None),
    ),
    "MetricFamily": (
        ("name", 1, _OPT, _F.TYPE_STRING, None),
        ("help", 2, _OPT, _F.TYPE_STRING, None),
        ("type", 3, _OPT, _F.TYPE_ENUM, "MetricType"),
        ("metric", 4, _REP, _F.TYPE_MESSAGE, "Metric"),
        ("unit", 5, _OPT, _F.TYPE_STRING, None),
    ),
}
# MetricType's values, in metrics.proto's order
TYPES = ("COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM")
COUNTER, GAUGE, SUMMARY, UNTYPED, HISTOGRAM, GAUGE_HISTOGRAM = range(len(TYPES))


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """``metrics.proto`` as a descriptor, from ``_SCHEMA``."""
    package = "io.prometheus.client"
    out = descriptor_pb2.FileDescriptorProto(
        name="io/prometheus/client/metrics.proto",
        package=package,
        syntax="proto2",
        dependency=["google/protobuf/timestamp.proto"],
    )
    kind = out.enum_type.add(name="MetricType")
    for number, name in enumerate(TYPES):
        kind.value.add(name=name, number=number)
    for message, fields in _SCHEMA.items():
        found = out.message_type.add(name=message)
        for name, number, label, type_, type_name in fields:
            field = found.field.add(name=name, number=number, label=label, type=type_)
            if type_name is not None:
                field.type_name = (
                    type_name if type_name.startswith(".") else (f".{package}.{type_name}")
                )
    return out


def _classes() -> dict[str, Any]:
    """The message classes, from a pool of their own (another library may have put a
    different ``metrics.proto`` in the default one)."""
    pool = descriptor_pool.DescriptorPool()
    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    pool.Add(timestamp)
    pool.Add(file_descriptor())
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"io.prometheus.client.{name}")
        )
        for name in _SCHEMA
    }


_MESSAGES = _classes()
LabelPair: Any = _MESSAGES["LabelPair"]
MetricFamily: Any = _MESSAGES["MetricFamily"]


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


# --- prometheus_client's families (every collector but the request series) ---

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("_count", "_sum"),
}


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


def read_delimited(data: bytes) -> list[Any]:
    """The ``MetricFamily`` messages of a delimited stream (what a scraper does with it)."""
    out = []
    i = 0
    while i < len(data):
        length = shift = 0
        while True:
            byte = data[i]
            i += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        out.append(MetricFamily.FromString(data[i : i + length]))
        i += length
    return out
