"""The OpenTelemetry setup (``export.telemetry``): what ``build_telemetry`` builds from the
``OTEL_*`` settings (tracing on or off, the sampler, the resource, the self metrics, the
request metrics' push meter and its exponential histograms), real OTLP exports over HTTP and
gRPC to receivers on loopback, and the bounded span processor, which drops and counts instead
of blocking when the exporter cannot keep up or fails. The spans' content: test_tracing.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import generate_latest

from llmobs import __version__
from llmobs.config.otel import otel_settings
from llmobs.export.metrics.catalogue import BUILD_INFO, REQUESTS, SPANS_DROPPED, TTFT
from llmobs.export.metrics.exposition import Registry
from llmobs.export.telemetry import BoundedSpanProcessor, Telemetry, build_telemetry, sampler_for
from tests.support.otlp import OtlpReceiver
from tests.support.ports import port_of, refused_port
from tests.support.servers import AppFactory, eventually

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
QUICK = {"OTEL_BSP_SCHEDULE_DELAY": "50"}  # spans leave within 50 ms


@pytest.mark.parametrize(
    ("name", "description"),
    [("always_on", "AlwaysOnSampler"), ("always_off", "AlwaysOffSampler"),
     ("traceidratio", "TraceIdRatioBased{0.25}"),
     ("parentbased_always_on", "ParentBased{root:AlwaysOnSampler,"),
     ("parentbased_always_off", "ParentBased{root:AlwaysOffSampler,"),
     ("parentbased_traceidratio", "ParentBased{root:TraceIdRatioBased{0.25},")],
)  # fmt: skip
def test_the_sampler_is_the_one_the_variables_name(name: str, description: str) -> None:
    otel = otel_settings({"OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert sampler_for(otel).get_description().startswith(description)


def test_without_an_endpoint_nothing_is_traced_or_pushed() -> None:
    telemetry = build_telemetry(otel=otel_settings({}))
    try:
        assert (telemetry.tracer, telemetry.span_processor, telemetry.push_meter) == (
            None, None, None,
        )  # fmt: skip
        assert isinstance(telemetry.registry, Registry)  # rendered collector by collector
        assert telemetry.build_info is not None
        samples = {s.name: s for f in telemetry.registry.collect() for s in f.samples}
        info = samples[BUILD_INFO.prometheus]
        assert info.value == 1 and info.labels["version"] == __version__
        assert SPANS_DROPPED.prometheus not in samples
    finally:
        telemetry.shutdown()


def test_self_metrics_are_left_out_when_asked() -> None:
    telemetry = build_telemetry(self_metrics=False)
    try:
        assert telemetry.build_info is None
        assert generate_latest(telemetry.registry) == b""
    finally:
        telemetry.shutdown()


def test_spans_carry_the_resource_and_drops_are_counted() -> None:
    """``OTEL_SERVICE_NAME`` wins over the resource attributes' service.name; the version is
    the sidecar's; ``llmobs_spans_dropped_total`` is there from the start, at 0."""
    exporter = InMemorySpanExporter()
    resource = "service.name=no,k8s.pod.name=p-1"
    otel = otel_settings({"OTEL_SERVICE_NAME": "pod-a", "OTEL_RESOURCE_ATTRIBUTES": resource})
    telemetry = build_telemetry(otel=otel, span_exporter=exporter, self_metrics=False)
    dropped = telemetry.registry.get_sample_value
    try:
        assert dropped(SPANS_DROPPED.prometheus) == 0
        telemetry.spans_dropped(3)
        assert dropped(SPANS_DROPPED.prometheus) == 3
        assert telemetry.tracer is not None and telemetry.tracer_provider is not None
        telemetry.tracer.start_span("s").end()
        telemetry.tracer_provider.force_flush()
        (span,) = exporter.get_finished_spans()
        found = dict(span.resource.attributes)
        assert found["service.name"] == "pod-a" and found["k8s.pod.name"] == "p-1"
        assert found["service.version"] == __version__
    finally:
        telemetry.shutdown()


async def test_spans_reach_a_real_otlp_http_receiver(start_app: AppFactory) -> None:
    receiver = OtlpReceiver()
    collector = await start_app(receiver.app())
    otel = otel_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_SERVICE_NAME": "pod-a",
                          **QUICK})  # fmt: skip
    telemetry = build_telemetry(otel=otel, self_metrics=False)
    server_id = client_trace(telemetry)
    await eventually(lambda: len(receiver.spans()) == 2)
    await asyncio.to_thread(telemetry.shutdown)  # the exporter posts to this loop's receiver
    names = {span.name: span for span, _ in receiver.spans()}
    server, child = names["server"], names["child"]
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == PARENT_ID
    assert server.span_id.hex() == server_id and child.parent_span_id == server.span_id
    resource = {a.key: a.value.string_value for a in receiver.spans()[0][1].resource.attributes}
    assert resource["service.name"] == "pod-a"


def client_trace(telemetry: Telemetry) -> str:
    """A server span continuing a client's trace, with a child; returns its span id."""
    tracer = telemetry.tracer
    assert tracer is not None
    parent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    with tracer.start_as_current_span("server", context=context, kind=SpanKind.SERVER) as span:
        tracer.start_span("child").end()
    return f"{span.get_span_context().span_id:016x}"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Any] = []

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.spans += [
            s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
        ]
        return trace_service_pb2.ExportTraceServiceResponse()


async def test_spans_reach_a_real_otlp_grpc_receiver() -> None:
    server = grpc.aio.server()
    collector = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        otel = otel_settings({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                              "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                              **QUICK})  # fmt: skip
        telemetry = build_telemetry(otel=otel, self_metrics=False)
        server_id = client_trace(telemetry)
        await eventually(lambda: len(collector.spans) == 2)
        await asyncio.to_thread(telemetry.shutdown)
        assert {s.name for s in collector.spans} == {"server", "child"}
        assert all(s.trace_id.hex() == TRACE_ID for s in collector.spans)
        assert server_id in {s.span_id.hex() for s in collector.spans}
    finally:
        await server.stop(None)


@pytest.mark.parametrize(
    ("aggregation", "data"),
    [("base2_exponential_bucket_histogram", "exponential_histogram"),
     ("explicit_bucket_histogram", "histogram")],
)  # fmt: skip
async def test_request_metrics_are_pushed_over_otlp_when_asked(
    start_app: AppFactory, aggregation: str, data: str
) -> None:
    """The request metrics go to the push meter, whose only reader is the OTLP one: pushed,
    never on /metrics twice; the collectors' meter feeds both. A latency histogram goes out
    exponential at its native schema, unless the spec's variable asks for explicit buckets."""
    receiver = OtlpReceiver()
    url = await start_app(receiver.app())
    otel = otel_settings({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url + "/v1/metrics",
                          "OTEL_METRICS_EXPORTER": "otlp,prometheus",
                          "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": aggregation,
                          })  # fmt: skip
    assert not otel.tracing  # metrics only
    telemetry = build_telemetry(otel=otel, self_metrics=False)
    push = telemetry.push_meter
    assert push is not None and telemetry.tracer is None
    push.create_histogram(TTFT.name, TTFT.unit).record(0.3, {"gen_ai.request.model": "m"})
    push.create_counter(REQUESTS.name).add(1)
    telemetry.meter.create_counter("t.collected").add(2)
    scraped = generate_latest(telemetry.registry).decode()
    assert "t_collected_total 2.0" in scraped
    assert TTFT.prometheus not in scraped and REQUESTS.prometheus not in scraped
    await asyncio.to_thread(telemetry.shutdown)  # the last export, to this loop's receiver
    ttft = receiver.metrics(TTFT.name)[-1]
    assert ttft.WhichOneof("data") == data
    (point,) = getattr(ttft, data).data_points
    assert point.count == 1
    if data == "exponential_histogram":
        assert TTFT.native is not None and point.scale == TTFT.native.schema
    assert receiver.metrics(REQUESTS.name) and receiver.metrics("t.collected")


def end_spans(processor: BoundedSpanProcessor, count: int) -> Telemetry:
    """``count`` spans ended on a tracer whose provider also feeds ``processor``; returns the
    telemetry, to shut down."""
    telemetry = build_telemetry(span_exporter=InMemorySpanExporter(), self_metrics=False)
    assert telemetry.tracer_provider is not None and telemetry.tracer is not None
    telemetry.tracer_provider.add_span_processor(processor)
    tracer = telemetry.tracer
    for i in range(count):
        tracer.start_span(f"s{i}").end()
    return telemetry


class BlockedExporter(SpanExporter):
    """An exporter stuck on a slow collector."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(5)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_a_full_export_queue_drops_and_counts_instead_of_blocking() -> None:
    exporter = BlockedExporter()
    drops: list[int] = []
    processor = BoundedSpanProcessor(exporter, max_queue=3, batch=1, delay_s=0.01,
                                     on_drop=drops.append)  # fmt: skip
    telemetry = end_spans(processor, 50)  # never blocks, however slow the exporter
    assert processor.dropped >= 45
    assert sum(drops) == processor.dropped
    exporter.release.set()
    processor.shutdown()
    assert exporter.exported + processor.dropped == 50
    telemetry.shutdown()


class FailingExporter(SpanExporter):
    """A collector that answers every export with an error."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


def test_failed_exports_count_their_spans_as_dropped() -> None:
    drops: list[int] = []
    processor = BoundedSpanProcessor(FailingExporter(), batch=4, delay_s=0.01, on_drop=drops.append)
    telemetry = end_spans(processor, 10)
    processor.shutdown()
    assert sum(drops) == 10
    assert processor.dropped == 10
    telemetry.shutdown()


def test_an_unreachable_collector_is_one_line_of_ours_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real OTLP/HTTP exporter against a port that refuses: one line naming the endpoint
    and what to check, none of the SDK's retry text (its connection pool's repr), and a second
    failure soon after says nothing more (the spans are still counted)."""
    with refused_port() as closed:
        endpoint = f"http://127.0.0.1:{port_of(closed)}/v1/traces"
        otel = otel_settings({
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "500", "OTEL_BSP_SCHEDULE_DELAY": "60000",
        })  # fmt: skip
        telemetry = build_telemetry(otel=otel)
        assert telemetry.tracer is not None and telemetry.span_processor is not None
        with caplog.at_level(logging.DEBUG):
            for _ in range(2):
                telemetry.tracer.start_span("chat m").end()
                telemetry.span_processor.force_flush()
        telemetry.shutdown()
    ours = [r.getMessage() for r in caplog.records if r.name == "llmobs.telemetry"]
    assert ours == [
        f"span export to {endpoint} (OTLP http/protobuf) failed: 1 span lost (is the "
        "collector up and reachable? OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); said again at most "
        "every 60 s"
    ]
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert not sdk and "HTTPConnectionPool" not in caplog.text
