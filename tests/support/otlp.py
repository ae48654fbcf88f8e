"""An OTLP/HTTP trace and metrics receiver on loopback: what a collector (Jaeger, Tempo, the
OpenTelemetry Collector) does with the sidecar's exports, decoded with the protocol's own messages
(``opentelemetry-proto``), so a test sees the spans exactly as a tracing backend gets them."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


class OtlpReceiver:
    """``app()`` serves ``POST /v1/traces`` and ``/v1/metrics``; ``requests`` and
    ``metric_requests`` are the export requests received."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        app.router.add_post("/v1/metrics", self._metrics)
        return app

    async def _traces(self, request: web.Request) -> web.Response:
        message = trace_service_pb2.ExportTraceServiceRequest()
        reply = trace_service_pb2.ExportTraceServiceResponse()
        return await _receive(request, message, reply, self.requests)

    async def _metrics(self, request: web.Request) -> web.Response:
        message = metrics_service_pb2.ExportMetricsServiceRequest()
        reply = metrics_service_pb2.ExportMetricsServiceResponse()
        return await _receive(request, message, reply, self.metric_requests)

    def metrics(self, name: str) -> list[Any]:
        """Every metric named ``name`` received, in order (each with its data points)."""
        return [
            metric
            for message in self.metric_requests
            for rm in message.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == name
        ]

    def spans(self) -> list[tuple[Any, Any]]:
        """Every span received, with its resource spans (for the resource's attributes)."""
        return [
            (span, rs)
            for message in self.requests
            for rs in message.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def trace_ids(self) -> set[str]:
        return {span.trace_id.hex() for span, _ in self.spans()}


def attributes(span: Any) -> dict[str, Any]:
    """A span's attributes as Python values (string, bool, int, double, or a list of them)."""

    def value(v: Any) -> Any:
        kind = v.WhichOneof("value")
        if kind == "array_value":
            return [value(x) for x in v.array_value.values]
        return getattr(v, kind) if kind else None

    return {a.key: value(a.value) for a in span.attributes}


async def _receive(request: web.Request, message: Any, reply: Any, into: list[Any]) -> web.Response:
    """One OTLP/HTTP export: ``message`` parsed from the body and kept, ``reply`` answered."""
    if request.content_type != "application/x-protobuf":
        return web.Response(status=415, text="OTLP/HTTP protobuf only")
    message.ParseFromString(await request.read())
    into.append(message)
    return web.Response(body=reply.SerializeToString(), content_type="application/x-protobuf")
