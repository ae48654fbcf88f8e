"""The OpenTelemetry SDK's configuration: the standard ``OTEL_*`` variables, read once here.

Tracing is off without an endpoint; metrics go to Prometheus (``/metrics``), and over OTLP too
when ``OTEL_METRICS_EXPORTER`` names it. A bad value fails at start-up naming its variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from llmobs.config.options import ConfigError


@dataclass(frozen=True)
class OtelSettings:
    """What the standard ``OTEL_*`` variables say (tracing is off without an endpoint)."""

    service_name: str = "llmobs"
    resource_attributes: tuple[tuple[str, str], ...] = ()
    traces_endpoint: str | None = None  # full URL (HTTP) or host:port (gRPC); None: no tracing
    traces_protocol: str = "http/protobuf"  # or "grpc"
    traces_headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 10.0
    sampler: str = "parentbased_always_on"
    sampler_arg: float = 1.0
    metrics_exporters: tuple[str, ...] = ("prometheus",)
    metrics_endpoint: str | None = None
    metrics_protocol: str = "http/protobuf"
    metrics_headers: tuple[tuple[str, str], ...] = ()
    metric_export_interval_s: float = 60.0
    # OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION: the latency histograms go out
    # as base-2 exponential ones (the native histograms' counterpart) unless it says explicit
    exponential_histograms: bool = True
    # OTEL_SEMCONV_STABILITY_OPT_IN has gen_ai_latest_experimental: the newest GenAI
    # conventions' names (the token usage split by kind) instead of v1.41's
    genai_latest: bool = False
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_s: float = 1.0
    bsp_max_export_batch_size: int = 512

    @property
    def tracing(self) -> bool:
        return self.traces_endpoint is not None


_SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
_PROTOCOLS = ("http/protobuf", "grpc")


def _pairs(text: str, source: str) -> tuple[tuple[str, str], ...]:
    """``k1=v1,k2=v2`` (W3C baggage style, values percent-decoded), as in the OTel spec."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{source}: expected key=value pairs, got {item!r}")
        out.append((key.strip(), unquote(value.strip())))
    return tuple(out)


def _endpoint(environ: Mapping[str, str], signal: str, protocol: str) -> str | None:
    specific = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    if specific:
        return specific
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not base:
        return None
    if protocol == "grpc":
        return base
    return base.rstrip("/") + f"/v1/{signal}"  # the spec: signal path appended to the base


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: invalid number {raw!r}") from exc
    if value < 0:
        raise ConfigError(f"{name}: must be >= 0, got {raw}")
    return value


_AGGREGATIONS = ("base2_exponential_bucket_histogram", "explicit_bucket_histogram")


def _exponential(environ: Mapping[str, str]) -> bool:
    """Whether pushed latency histograms are exponential: the spec's variable, with our
    default (exponential: the counterpart of the native histograms /metrics serves)."""
    name = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
    value = environ.get(name, "").strip().lower() or _AGGREGATIONS[0]
    if value not in _AGGREGATIONS:
        raise ConfigError(f"{name}: expected one of {', '.join(_AGGREGATIONS)}")
    return value == _AGGREGATIONS[0]


GENAI_LATEST = "gen_ai_latest_experimental"


def genai_latest(environ: Mapping[str, str]) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma-separated list of categories' values,
    as the conventions define it) asks for the newest GenAI conventions. Other categories'
    values (``http``, ``database/dup``) are for other instrumentations: ignored."""
    values = environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")
    return GENAI_LATEST in (value.strip().lower() for value in values)


def otel_settings(environ: Mapping[str, str]) -> OtelSettings:
    """Read the standard OpenTelemetry environment variables once; fail naming the variable."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return OtelSettings(metrics_exporters=("prometheus",), genai_latest=genai_latest(environ))
    protocols = {}
    for signal in ("traces", "metrics"):
        name = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
        value = environ.get(name) or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
        if value not in _PROTOCOLS:
            raise ConfigError(f"{name} / OTEL_EXPORTER_OTLP_PROTOCOL: expected one of {_PROTOCOLS}")
        protocols[signal] = value
    sampler = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in _SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER: expected one of {', '.join(_SAMPLERS)}")
    ratio = _number(environ, "OTEL_TRACES_SAMPLER_ARG", 1.0)
    if ratio > 1:
        raise ConfigError("OTEL_TRACES_SAMPLER_ARG: a ratio must be within [0, 1]")
    traces = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    metrics = tuple(
        e.strip().lower()
        for e in environ.get("OTEL_METRICS_EXPORTER", "prometheus").split(",")
        if e.strip() and e.strip().lower() != "none"
    )
    for exporter in metrics:
        if exporter not in ("prometheus", "otlp"):
            raise ConfigError(f"OTEL_METRICS_EXPORTER: unsupported exporter {exporter!r}")
    headers = environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    return OtelSettings(
        service_name=environ.get("OTEL_SERVICE_NAME", "").strip() or "llmobs",
        resource_attributes=_pairs(
            environ.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES"
        ),
        traces_endpoint=(
            _endpoint(environ, "traces", protocols["traces"]) if traces != "none" else None
        ),
        traces_protocol=protocols["traces"],
        traces_headers=_pairs(
            environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS", headers), "OTEL_EXPORTER_OTLP_HEADERS"
        ),
        timeout_s=_number(environ, "OTEL_EXPORTER_OTLP_TIMEOUT", 10_000.0) / 1000,
        sampler=sampler,
        sampler_arg=ratio,
        metrics_exporters=metrics or ("prometheus",),
        metrics_endpoint=_endpoint(environ, "metrics", protocols["metrics"]),
        metrics_protocol=protocols["metrics"],
        metrics_headers=_pairs(
            environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS", headers),
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        metric_export_interval_s=_number(environ, "OTEL_METRIC_EXPORT_INTERVAL", 60_000.0) / 1000,
        exponential_histograms=_exponential(environ),
        genai_latest=genai_latest(environ),
        bsp_max_queue_size=int(_number(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)),
        bsp_schedule_delay_s=_number(environ, "OTEL_BSP_SCHEDULE_DELAY", 1000.0) / 1000,
        bsp_max_export_batch_size=int(_number(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
    )
