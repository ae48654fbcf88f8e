"""OpenTelemetry SDK setup: the only module that builds providers, processors and exporters.

Each sidecar (and each test) gets its own ``CollectorRegistry``, ``MeterProvider`` and, when
tracing is on, ``TracerProvider``: nothing global, so tests build many side by side. The
Prometheus reader is configured without ``target_info`` and without ``otel_scope_*`` labels,
which would only add noise to every series. Everything comes from ``OtelSettings`` (the
standard ``OTEL_*`` variables, read once in ``config``), never from the environment here.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from llmobs import __version__
from llmobs.config.otel import OtelSettings
from llmobs.export.metrics import process
from llmobs.export.metrics.catalogue import REQUEST_METRICS, SPANS_DROPPED, Kind
from llmobs.export.metrics.exposition import Registry
from llmobs.export.metrics.process import BuildInfo

SCOPE = "llmobs"
log = logging.getLogger("llmobs.telemetry")


SAY_EVERY = 60.0  # seconds between two lines about failed span exports
# the OTLP/HTTP span exporter's own logger: its retry text (a connection pool's repr, a
# resolver's error) is replaced by BoundedSpanProcessor's one line, which names the endpoint
# (the gRPC exporters share one logger with the metrics', which stays as it is)
_EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",)


class BoundedSpanProcessor(SpanProcessor):
    """Batches finished spans to an exporter from a worker thread, off the event loop.

    The queue is bounded: when the exporter cannot keep up, new spans are dropped and counted
    (``on_drop``), so tracing can never hold up the relay or grow memory without bound.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int = 2048,
        delay_s: float = 1.0,
        batch: int = 512,
        on_drop: Callable[[int], None] = lambda n: None,
        where: str = "the span exporter",
    ) -> None:
        """``where``: what the spans are exported to, as the failure's line names it."""
        self._exporter = exporter
        self._where = where
        self._said = -math.inf  # when a failed export was last logged (monotonic seconds)
        self._unsaid = 0  # spans lost since
        self._max_queue = max_queue
        self._delay = delay_s
        self._batch = batch
        self._on_drop = on_drop
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="llmobs-spans", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._lock:
            dropped = len(self._queue) >= self._max_queue or self._stopped
            if dropped:
                self.dropped += 1
            else:
                self._queue.append(span)
            full = len(self._queue) >= self._batch
        if dropped:
            self._on_drop(1)
        elif full:
            self._wake.set()

    def _take(self) -> list[ReadableSpan]:
        with self._lock:
            return [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]

    def _export(self, spans: Sequence[ReadableSpan]) -> None:
        """Export a batch; a failed export loses its spans, which are counted as dropped."""
        try:
            ok = self._exporter.export(spans) is SpanExportResult.SUCCESS
        except Exception as exc:  # an exporter failing must not kill the worker
            log.warning("span export to %s raised %s", self._where, type(exc).__name__)
            ok = False
        if not ok:
            self._lost(len(spans))
            with self._lock:
                self.dropped += len(spans)
            self._on_drop(len(spans))

    def _lost(self, count: int) -> None:
        """One line for the first failure, then at most one a ``SAY_EVERY`` seconds with the
        spans lost meanwhile: an unreachable collector is one problem, not a line a batch."""
        self._unsaid += count
        now = time.monotonic()
        if now - self._said >= SAY_EVERY:
            log.warning(
                "span export to %s failed: %d span%s lost (is the collector up and reachable? "
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); said again at most every %g s",
                self._where, self._unsaid, "" if self._unsaid == 1 else "s", SAY_EVERY,
            )  # fmt: skip
            self._said, self._unsaid = now, 0

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._delay)
            self._wake.clear()
            while batch := self._take():
                self._export(batch)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        while batch := self._take():
            self._export(batch)
        return True

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5)
        self.force_flush()
        self._exporter.shutdown()


@dataclass(frozen=True)
class Telemetry:
    """A registry to scrape, the meter provider that feeds it, and tracing when it is on.

    The request metrics are no OpenTelemetry instruments on the Prometheus path
    (``metrics.sink``): the sink registers its series on ``registry``, the one /metrics
    renders, and records into ``push_meter`` only when metrics are also pushed over OTLP: a
    meter of a provider whose only reader is the OTLP one, so nothing shows twice on /metrics.
    Collectors' gauges and ``llmobs.spans.dropped`` are on ``meter``, whose provider feeds
    Prometheus and, when configured, OTLP as well.
    """

    registry: CollectorRegistry
    meter_provider: MeterProvider
    meter: Meter
    tracer_provider: TracerProvider | None = None
    span_processor: BoundedSpanProcessor | None = None
    spans_dropped: Callable[[int], None] = lambda n: None  # counts into llmobs.spans.dropped
    push_provider: MeterProvider | None = None  # request metrics pushed over OTLP, if asked
    build_info: BuildInfo | None = None  # llmobs_build_info (its event loop set at start)
    genai_latest: bool = False  # the newest GenAI conventions (OTEL_SEMCONV_STABILITY_OPT_IN)

    @property
    def push_meter(self) -> Meter | None:
        """The meter request metrics are pushed to over OTLP, when they are."""
        if self.push_provider is None:
            return None
        return self.push_provider.get_meter(SCOPE, __version__)

    @property
    def tracer(self) -> Tracer | None:
        if self.tracer_provider is None:
            return None
        return self.tracer_provider.get_tracer(SCOPE, __version__)

    def shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        if self.push_provider is not None:
            self.push_provider.shutdown()


def _resource(otel: OtelSettings) -> Resource:
    attributes: dict[str, str] = {"service.version": __version__, **dict(otel.resource_attributes)}
    attributes["service.name"] = otel.service_name
    return Resource(attributes)


def sampler_for(otel: OtelSettings) -> Sampler:
    """The sampler the standard OTEL_TRACES_SAMPLER(_ARG) name."""
    name = otel.sampler
    root: Sampler = ALWAYS_ON
    if name.endswith("always_off"):
        root = ALWAYS_OFF
    elif name.endswith("traceidratio"):
        root = TraceIdRatioBased(otel.sampler_arg)
    return ParentBased(root) if name.startswith("parentbased") else root


def _span_exporter(otel: OtelSettings) -> SpanExporter:
    for name in _EXPORTER_LOGGERS:  # our line says it, naming the endpoint
        logging.getLogger(name).setLevel(logging.CRITICAL)
    endpoint, headers = otel.traces_endpoint, dict(otel.traces_headers)
    if otel.traces_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcExporter,
        )

        insecure = bool(endpoint and endpoint.startswith("http://"))
        return GrpcExporter(endpoint, insecure=insecure, headers=headers, timeout=otel.timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint, headers=headers, timeout=otel.timeout_s)


def _otlp_metric_reader(otel: OtelSettings) -> MetricReader:
    endpoint, headers = otel.metrics_endpoint, dict(otel.metrics_headers)
    interval = int(otel.metric_export_interval_s * 1000)
    if otel.metrics_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter as GrpcMetrics,
        )

        insecure = bool(endpoint and endpoint.startswith("http://"))
        grpc = GrpcMetrics(endpoint, insecure=insecure, headers=headers, timeout=otel.timeout_s)
        return PeriodicExportingMetricReader(grpc, export_interval_millis=interval)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter as HttpMetrics,
    )

    http = HttpMetrics(endpoint, headers=headers, timeout=otel.timeout_s)
    return PeriodicExportingMetricReader(http, export_interval_millis=interval)


def _exponential_views() -> list[View]:
    """The request histograms that /metrics also serves as native ones, pushed as base-2
    exponential histograms from the same start: OTel's scale is Prometheus' schema, so a
    family starts at its native schema and keeps at most as many buckets (downscaling alike
    when its values spread wider)."""
    return [
        View(
            instrument_name=metric.name,
            aggregation=ExponentialBucketHistogramAggregation(
                max_size=metric.native.limit, max_scale=metric.native.schema
            ),
        )
        for metric in REQUEST_METRICS
        if metric.native is not None and metric.kind is Kind.HISTOGRAM
    ]


def build_telemetry(
    registry: CollectorRegistry | None = None,
    otel: OtelSettings | None = None,
    span_exporter: SpanExporter | None = None,
    self_metrics: bool = True,
) -> Telemetry:
    """Providers for one sidecar. Tracing is on when ``otel`` names a traces endpoint or a
    ``span_exporter`` is given (tests pass an in-memory one). ``self_metrics``: the process,
    Python and build metrics on the registry (tests comparing two renderings leave these
    ever-changing numbers out)."""
    otel = otel or OtelSettings()
    registry = registry if registry is not None else Registry()
    build_info = process.register(registry) if self_metrics else None
    resource = _resource(otel)
    readers: list[MetricReader] = [
        PrometheusMetricReader(
            disable_target_info=True, scope_info_enabled=False, registry=registry
        )
    ]
    push_provider = None
    if "otlp" in otel.metrics_exporters and otel.metrics_endpoint:
        readers.append(_otlp_metric_reader(otel))
        push_provider = MeterProvider(
            metric_readers=[_otlp_metric_reader(otel)], resource=resource, shutdown_on_exit=False,
            views=_exponential_views() if otel.exponential_histograms else (),
        )  # fmt: skip
    provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    meter = provider.get_meter(SCOPE, __version__)
    if span_exporter is None and not otel.tracing:
        return Telemetry(
            registry, provider, meter, push_provider=push_provider, build_info=build_info,
            genai_latest=otel.genai_latest,
        )  # fmt: skip
    dropped = meter.create_counter(
        SPANS_DROPPED.name, SPANS_DROPPED.unit, SPANS_DROPPED.description
    )
    dropped.add(0)
    processor = BoundedSpanProcessor(
        span_exporter or _span_exporter(otel),
        where=f"{otel.traces_endpoint} (OTLP {otel.traces_protocol})",
        max_queue=otel.bsp_max_queue_size,
        delay_s=otel.bsp_schedule_delay_s,
        batch=otel.bsp_max_export_batch_size,
        on_drop=dropped.add,
    )
    tracer_provider = TracerProvider(
        sampler=sampler_for(otel), resource=resource, shutdown_on_exit=False
    )
    tracer_provider.add_span_processor(processor)
    return Telemetry(
        registry, provider, meter, tracer_provider, processor, dropped.add, push_provider,
        build_info, otel.genai_latest,
    )  # fmt: skip
