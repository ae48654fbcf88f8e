"""The protobuf encoder (``export.metrics.protobuf``): the classic series the text format has,
native buckets that hold each observation where its key says, the exemplars OpenMetrics has,
and the delimited framing a scraper reads."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Enum, Gauge, Histogram, Info, Summary
from prometheus_client.parser import text_string_to_metric_families

from llmobs.export.metrics import client_model, protobuf
from llmobs.export.metrics.catalogue import SMOOTHNESS, TTFT
from llmobs.export.metrics.exposition import Format
from llmobs.export.metrics.native import ZERO_THRESHOLD, key
from tests.support.exposition import read_delimited, rendered
from tests.support.metrics import (
    CLOCK,
    recorder_and_telemetry,
    replay,
    traced_sink,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _label_set(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, repr(float(v)) if k == "le" else v) for k, v in labels.items())


def text_samples(text: str) -> Samples:
    """Every sample of the text format but ``_created`` (not a series in protobuf)."""
    return {
        (s.name, _label_set(s.labels)): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _histogram_samples(name: str, labels: dict[str, str], h: Any, out: Samples) -> None:
    for bucket in h.bucket:
        le = {**labels, "le": repr(bucket.upper_bound)}
        out[(f"{name}_bucket", _label_set(le))] = float(bucket.cumulative_count)
    out[(f"{name}_bucket", _label_set({**labels, "le": "inf"}))] = float(h.sample_count)
    out[(f"{name}_count", _label_set(labels))] = float(h.sample_count)
    out[(f"{name}_sum", _label_set(labels))] = h.sample_sum


def proto_samples(data: bytes) -> Samples:
    """The classic series a scraper makes of the protobuf families."""
    out: Samples = {}
    for family in read_delimited(data):
        name = family.name
        for metric in family.metric:
            labels = {pair.name: pair.value for pair in metric.label}
            kind = family.type
            if kind == client_model.HISTOGRAM:
                _histogram_samples(name, labels, metric.histogram, out)
            elif kind == client_model.SUMMARY:
                out[(f"{name}_count", _label_set(labels))] = metric.summary.sample_count
                out[(f"{name}_sum", _label_set(labels))] = metric.summary.sample_sum
            else:
                value = {
                    client_model.COUNTER: metric.counter.value,
                    client_model.GAUGE: metric.gauge.value,
                }
                out[(name, _label_set(labels))] = value.get(kind, metric.untyped.value)
    return out


def test_protobuf_has_every_classic_series_of_the_text_format() -> None:
    """The request series and every other kind of collector (prometheus_client's counter,
    gauge, histogram, summary, info, enum): the same series, the same values."""
    recorder, telemetry = recorder_and_telemetry(tracing=True)
    for model in ("llama", 'we"ird\\mo\ndel ✓'):
        replay(recorder, model, [20.0] * 9)
    replay(recorder, "llama", [20.0] * 4 + [120.0] + [20.0] * 4)
    registry = telemetry.registry
    Counter("t_things", "Things.", ["kind"], registry=registry).labels("a").inc(3)
    Gauge("t_level", "Level.", registry=registry).set(2.5)
    Histogram("t_wait_seconds", "Wait.", buckets=(0.1, 1.0), registry=registry).observe(0.5)
    Summary("t_size_bytes", "Size.", registry=registry).observe(7)
    Info("t_build", "Build.", registry=registry).info({"version": "1.2"})
    # a label named "quantile" outside a summary is an ordinary label
    share = Gauge("t_share", "Share.", ["quantile"], registry=registry)
    share.labels("0.5").set(1)
    share.labels("0.9").set(2)
    Enum("t_state", "State.", states=["up", "down"], registry=registry).state("down")
    try:
        text, data = rendered(registry).decode(), rendered(registry, Format.PROTOBUF)
    finally:
        telemetry.shutdown()
    assert proto_samples(data) == text_samples(text)
    names = {f.name for f in read_delimited(data)}
    assert {"t_things_total", "t_build_info", "t_state", "llmobs_requests_total"} <= names


def test_native_buckets_hold_each_observation_under_its_key() -> None:
    """The TTFT and smoothness of the traced sink, decoded from the protobuf spans and deltas:
    each observation counted in the bucket of its key at the family's schema, the zero
    threshold set (what marks the histogram native), count and sum the classic ones'."""
    _, registry = traced_sink()
    data = rendered(registry, Format.PROTOBUF)
    families = {f.name: f for f in read_delimited(data)}
    for metric, observed in (
        (TTFT, {("chat", "llama"): [0.12, 0.48], ("chat", "qwen"): [2.5]}),
        (SMOOTHNESS, None),
    ):
        family = families[metric.prometheus]
        assert family.type == client_model.HISTOGRAM
        for m in family.metric:
            h = m.histogram
            assert metric.native is not None
            assert h.zero_threshold == ZERO_THRESHOLD and h.schema == metric.native.schema
            decoded = decode_native(h)
            assert sum(decoded.values()) + h.zero_count == h.sample_count
            if observed is None:
                continue
            labels = {p.name: p.value for p in m.label}
            values = observed.get((labels["gen_ai_operation_name"], labels["gen_ai_request_model"]))
            if values is not None:  # TTFT measured to the nanosecond: just above each
                keys: dict[int, int] = {}
                for value in values:
                    k = key(value + 1e-9, h.schema)
                    keys[k] = keys.get(k, 0) + 1
                assert decoded == keys


def decode_native(h: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    index = count = i = 0
    for n, span in enumerate(h.positive_span):
        index = span.offset if n == 0 else index + span.offset
        for _ in range(span.length):
            count += h.positive_delta[i]
            i += 1
            if count:
                out[index] = count
            index += 1
    return out


def test_exemplars_are_the_openmetrics_ones() -> None:
    """Each classic bucket's exemplar (trace, span, value, time) as OpenMetrics has it; a
    native histogram lists them again in its own field, each with its timestamp."""
    _, registry = traced_sink()
    data = rendered(registry, Format.PROTOBUF)
    ttft = {f.name: f for f in read_delimited(data)}[TTFT.prometheus]
    found = {}
    for m in ttft.metric:
        h = m.histogram
        for bucket in h.bucket:
            if bucket.HasField("exemplar"):
                ex = bucket.exemplar
                found[bucket.upper_bound] = (
                    {p.name: p.value for p in ex.label}, ex.value,
                    ex.timestamp.seconds + ex.timestamp.nanos / 1e9,
                )  # fmt: skip
        assert len(h.exemplars) == sum(b.HasField("exemplar") for b in h.bucket)
    assert found[0.15][0] == {"trace_id": f"{1:032x}", "span_id": f"{1:016x}"}
    assert abs(found[0.15][1] - 0.12) < 1e-6 and found[0.15][2] == CLOCK
    assert found[3.0][0]["trace_id"] == f"{3:032x}"


def test_delimited_framing() -> None:
    assert protobuf.varint(0) == b"\x00" and protobuf.varint(300) == b"\xac\x02"
    family = client_model.MetricFamily(name="x", type=client_model.GAUGE)
    family.metric.add().gauge.value = 1.0
    body = family.SerializeToString()
    stream = protobuf.delimited([body]) * 3
    assert [f.name for f in read_delimited(stream)] == ["x", "x", "x"]
