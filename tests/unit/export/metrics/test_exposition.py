"""The /metrics renderer (``export.metrics.exposition``): the format a scraper's ``Accept``
asks for (and ``Accept-Encoding``'s gzip, one reading of a quality for both), and in every
format the bytes prometheus_client's writers write for the same registry, its collectors
walked in their order, the request series encoded from their frames, other registries
written whole; golden files of all three formats from one traced sink. The encoders alone:
test_text.py, test_openmetrics.py, test_protobuf.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from llmobs.export.metrics import protobuf
from llmobs.export.metrics.exposition import Format, Registry, accepts_gzip, negotiate
from llmobs.export.metrics.frames import Frame
from llmobs.export.metrics.series import SeriesCollector
from llmobs.export.metrics.sink import MetricsSink
from llmobs.observe.record import TraceRef
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.exposition import rendered
from tests.support.metrics import (
    EXPOSITIONS,
    recorder_and_telemetry,
    replay,
    three_formats,
    traced_sink,
)
from tests.support.metrics import exposition as golden_text
from tests.support.odd_series import odd_collector
from tests.support.recording import record_request


def test_exposition_of_the_sidecar_registry_is_generate_latest() -> None:
    recorder, telemetry = recorder_and_telemetry(tracing=True)
    replay(recorder, "llama", [20.0] * 9)
    replay(recorder, 'we"ird\\mo\ndel ✓', [20.0, 300.0, 1.0])
    replay(recorder, "qwen", [20.0] * 9)
    try:
        assert rendered(telemetry.registry) == generate_latest(telemetry.registry)
    finally:
        telemetry.shutdown()


def test_exposition_of_the_golden_data_is_the_golden_text() -> None:
    """Same recorded data as the golden test, rendered the /metrics handler's way."""
    recorder, telemetry = recorder_and_telemetry(tracing=True)
    from tests.support.metrics import GOLDEN  # noqa: PLC0415

    replay(recorder, "llama", [20.0] * 9)
    replay(recorder, "llama", [20.0] * 4 + [120.0] + [20.0] * 4)
    text = rendered(telemetry.registry).decode()
    telemetry.shutdown()
    # The golden data has more requests; every family rendered here is in it, in its order.
    golden = GOLDEN.read_text()
    families = [line for line in text.splitlines() if line.startswith("# TYPE")]
    golden_families = [line for line in golden.splitlines() if line.startswith("# TYPE")]
    assert families == [f for f in golden_families if f in families]
    assert golden_text() == golden


def test_the_registry_lists_its_collectors_as_generate_latest_walks_them() -> None:
    """``Registry`` notes collectors as they register: the order ``generate_latest`` renders
    families in, so that rendering collector by collector gives the same bytes. The sidecar's
    registry is one, and the series are rendered by their own renderer, not collected."""
    recorder, telemetry = recorder_and_telemetry(tracing=True)
    replay(recorder, "llama", [20.0] * 9)
    registry = telemetry.registry
    assert isinstance(registry, Registry)
    members = registry.members()
    sink = recorder.sink
    assert isinstance(sink, MetricsSink)
    assert sink.collector in members
    walked = [name for c in members for name in _family_names(generate_latest(c))]
    assert walked == _family_names(generate_latest(registry))
    counted = CountedSeries(odd_collector()[0].families)
    registry.register(counted)
    written = rendered(registry)
    assert (counted.framed, counted.collected) == (1, 0)  # its frames encoded, not collected
    assert written == generate_latest(registry)
    registry.unregister(sink.collector)
    assert sink.collector not in registry.members()
    telemetry.shutdown()


class CountedSeries(SeriesCollector):
    """Series that count the frames taken of them and their collections."""

    framed = collected = 0

    def frames(self, exemplars: bool = False, natives: bool = False) -> list[Frame]:
        self.framed += 1
        return super().frames(exemplars, natives)

    def collect(self) -> Iterator[Metric]:
        self.collected += 1
        return super().collect()


def _family_names(text: bytes) -> list[str]:
    return [line.split()[2] for line in text.decode().splitlines() if line.startswith("# TYPE")]


def _protobuf_of(registry: CollectorRegistry) -> bytes:
    return b"".join(protobuf.family_bytes(family) for family in registry.collect())


@pytest.mark.parametrize(
    ("fmt", "writer"),
    [(Format.TEXT, generate_latest), (Format.OPENMETRICS, openmetrics_latest),
     (Format.PROTOBUF, _protobuf_of)],
)  # fmt: skip
def test_exposition_falls_back_for_other_registries(
    fmt: Format, writer: Callable[[CollectorRegistry], bytes]
) -> None:
    """A registry that cannot be rendered collector by collector (target info here) is
    written whole, by the format's writer of a registry, in every format."""
    registry = CollectorRegistry(target_info={"a": "b"})
    collector, _ = odd_collector()
    registry.register(collector)
    assert rendered(registry, fmt) == writer(registry)


def test_openmetrics_is_the_openmetrics_writers_with_exemplars() -> None:
    """The OpenMetrics exposition the handler serves (series rendered by their own renderer,
    exemplars and all) is byte for byte what prometheus_client's OpenMetrics writer makes of
    the same registry; and it parses, with the exemplars where they were recorded."""
    recorder, telemetry = recorder_and_telemetry(tracing=True)
    for model in ("llama", 'we"ird\\mo\ndel ✓'):
        replay(recorder, model, [20.0] * 9)
    traced = RequestStats(
        "chat", "llama", Outcome.OK, 200, True, 1.5, 0.4, 0.03, 12, 10, TokenSource.USAGE, 10,
        9.0, 0.27, 0.0081, 0.05, 0, 0.99,
    )  # fmt: skip
    trace = TraceRef("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    record_request(recorder, traced, (), trace)

    try:
        ours = rendered(telemetry.registry, Format.OPENMETRICS)
        assert ours == openmetrics_latest(telemetry.registry)  # type: ignore[no-untyped-call]
    finally:
        telemetry.shutdown()
    text = ours.decode()
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    assert "# TYPE llmobs_requests counter\n" in text  # OpenMetrics names counters so
    found = {
        (family.name, sample.exemplar.value)
        for family in text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
        for sample in family.samples
        if sample.exemplar is not None
    }
    assert ("gen_ai_server_time_to_first_token_seconds", 0.4) in found
    assert ("gen_ai_server_request_duration_seconds", 1.5) in found
    assert ("llmobs_inter_token_latency_seconds", 0.05) in found  # the worst gap's


@pytest.mark.parametrize(
    ("quality", "taken"),
    [("1", True), ("0.001", True), ('"0.5"', True), ("0", False), ("x", False), ("", False),
     ("nan", False), ("-1", False), ("2", False)],
)  # fmt: skip
def test_a_quality_reads_the_same_in_accept_and_accept_encoding(quality: str, taken: bool) -> None:
    """One reading of a ``q`` (RFC 9110 12.4.2) for both headers: 0 where it is no quality."""
    assert accepts_gzip(f"gzip;q={quality}") is taken
    assert accepts_gzip(f"br, GZIP ; Q = {quality}") is taken
    chosen = negotiate(f"application/openmetrics-text;q={quality}, text/plain;q=0.0001")
    assert (chosen is Format.OPENMETRICS) is taken


PROMETHEUS_242_NATIVE = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
    "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)  # what Prometheus 2.42 sends with --enable-feature=native-histograms
PROMETHEUS_242_EXEMPLARS = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "fmt"),
    [
        ("", Format.TEXT),
        ("*/*", Format.TEXT),
        ("application/json", Format.TEXT),
        ("text/plain;version=0.0.4", Format.TEXT),
        (PROMETHEUS_242_EXEMPLARS, Format.OPENMETRICS),
        (PROMETHEUS_242_NATIVE, Format.PROTOBUF),
        ("application/openmetrics-text", Format.OPENMETRICS),
        ("application/openmetrics-text;q=0.3,text/plain;q=0.9", Format.TEXT),
        ("text/plain;q=0.5, application/openmetrics-text;version=1.0.0", Format.OPENMETRICS),
        ("application/openmetrics-text;q=0", Format.TEXT),
        # protobuf only delimited, only of MetricFamily
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=text", Format.TEXT),
        ("application/vnd.google.protobuf;encoding=delimited", Format.TEXT),
        # qualities outside [0, 1] (and not numbers) count as 0; never a raise
        ("application/openmetrics-text;q=7,text/plain;q=0.5", Format.TEXT),
        ("application/openmetrics-text;q=nan", Format.TEXT),
        ("application/openmetrics-text;q=inf", Format.TEXT),
        ("application/openmetrics-text;q=", Format.TEXT),
        (";;,,;q=;=", Format.TEXT),
        ("APPLICATION/OPENMETRICS-TEXT; VERSION=1.0.0", Format.OPENMETRICS),
        ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
         "encoding=delimited;q=0.5,application/openmetrics-text;q=0.6", Format.OPENMETRICS),
        # what Prometheus 3 sends with scrape_protocols [PrometheusProto, OpenMetricsText1.0.0]
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4,"
         "*/*;q=0.3", Format.PROTOBUF),
    ],
)  # fmt: skip
def test_content_negotiation(accept: str, fmt: Format) -> None:
    assert negotiate(accept) is fmt


@pytest.mark.parametrize("name", ["metrics.txt", "metrics.om.txt", "metrics.pb.txt"])
def test_golden_expositions(name: str) -> None:
    """One traced sink, as /metrics serves it in each format (UPDATE_GOLDEN=1 writes them)."""
    _, registry = traced_sink()
    found = three_formats(registry)[name]
    path = EXPOSITIONS / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(found)
    assert found == path.read_text()
