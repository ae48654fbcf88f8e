"""client_model's messages (``io.prometheus.client``), built at import from ``_SCHEMA``, a
transcription of its ``io/prometheus/client/metrics.proto`` (proto2), for the protobuf
exposition (``protobuf``) to fill.

Not generated ``_pb2`` code: that pins the protobuf runtime to the version that generated it,
and a descriptor built here works with any runtime from 5.x on.
``tests/unit/export/metrics/test_client_model.py`` compiles the real ``metrics.proto`` and checks
every message, field number and type against this one.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

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
