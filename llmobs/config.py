"""Configuration of the sidecar: one frozen ``Settings``, read once at start-up.

Every option exists as a CLI flag and as an ``LLMOBS_*`` environment variable (twelve-factor),
declared once in ``OPTIONS`` so that ``--help``, the README table and the parser cannot drift
apart. Precedence: flag > environment > default. A bad value fails at start-up and names the
flag or variable it came from. This is the only module that reads the environment, and it
reads an injected mapping, never ``os.environ`` directly.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from llmobs.mbu import DTYPE_BYTES, KV_DTYPES


class ConfigError(ValueError):
    """A configuration value is invalid; the message names its source."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _parse_size(text: str) -> int:
    """Parse a byte size: plain bytes or with a KiB/MiB/GiB (or k/m/g) suffix."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    if cleaned and cleaned[-1] in units:
        return int(float(cleaned[:-1]) * units[cleaned[-1]])
    return int(cleaned)


_SI = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "p": 1e15}


def _parse_quantity(text: str) -> float:
    """A number with an optional SI suffix: k, M, G (or B, billions), T, P: 8B, 3.35T, 989e12."""
    cleaned = text.strip().lower().replace("_", "")
    if cleaned and cleaned[-1] in _SI:
        return float(cleaned[:-1]) * _SI[cleaned[-1]]
    return float(cleaned)


def _parse_list(text: str) -> tuple[str, ...]:
    """A comma-separated list (empty entries dropped)."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True)
class Option:
    """One setting: field, flag, environment variable, parser, help (defaults: on Settings)."""

    field: str
    flag: str
    env: str
    parse: Callable[[str], Any]
    help: str
    metavar: str = ""


OPTIONS: tuple[Option, ...] = (
    Option(
        "upstream",
        "--upstream",
        "LLMOBS_UPSTREAM",
        str,
        "base URL of the inference server every request is forwarded to",
        "URL",
    ),
    Option("host", "--host", "LLMOBS_HOST", str, "address the proxy listens on", "ADDR"),
    Option(
        "port",
        "--port",
        "LLMOBS_PORT",
        int,
        "port the proxy listens on (clients talk to it as to the engine)",
        "PORT",
    ),
    Option(
        "metrics_host",
        "--metrics-host",
        "LLMOBS_METRICS_HOST",
        str,
        "address of the metrics/health server",
        "ADDR",
    ),
    Option(
        "metrics_port",
        "--metrics-port",
        "LLMOBS_METRICS_PORT",
        int,
        "port serving /metrics, /healthz and /readyz",
        "PORT",
    ),
    Option(
        "connect_timeout",
        "--connect-timeout",
        "LLMOBS_CONNECT_TIMEOUT",
        float,
        "seconds to wait for a connection to the upstream (then 502)",
        "SECONDS",
    ),
    Option(
        "upstream_idle_timeout",
        "--upstream-idle-timeout",
        "LLMOBS_UPSTREAM_IDLE_TIMEOUT",
        float,
        "seconds an idle connection to the upstream is kept for reuse; keep it below the "
        "engine's own keep-alive timeout (uvicorn's and llama.cpp's: 5 s)",
        "SECONDS",
    ),
    Option(
        "read_timeout",
        "--read-timeout",
        "LLMOBS_READ_TIMEOUT",
        float,
        "seconds the upstream may stay silent, before headers or between chunks (then 504)",
        "SECONDS",
    ),
    Option(
        "client_timeout",
        "--client-timeout",
        "LLMOBS_CLIENT_TIMEOUT",
        float,
        "seconds a client may take to send a request's headers, and in all to send its body "
        "(then the connection is closed, or 408), and to take any of a response it stopped "
        "reading (then it is closed): slow clients cannot hold the sidecar",
        "SECONDS",
    ),
    Option(
        "max_body_bytes",
        "--max-body-bytes",
        "LLMOBS_MAX_BODY_BYTES",
        _parse_size,
        "largest request body accepted as it comes over the wire, chunked framing included "
        "(then 413); accepts KiB/MiB suffixes",
        "BYTES",
    ),
    Option(
        "max_models",
        "--max-models",
        "LLMOBS_MAX_MODELS",
        int,
        "distinct model label values before new ones are reported as 'other'",
        "N",
    ),
    Option(
        "stall_factor",
        "--stall-factor",
        "LLMOBS_STALL_FACTOR",
        float,
        "a gap between chunks is a stall when it exceeds this multiple of the request's "
        "median gap ...",
        "X",
    ),
    Option(
        "stall_min_gap",
        "--stall-min-gap",
        "LLMOBS_STALL_MIN_GAP",
        float,
        "... and is at least this many seconds",
        "SECONDS",
    ),
    Option(
        "max_line_bytes",
        "--max-line-bytes",
        "LLMOBS_MAX_LINE_BYTES",
        _parse_size,
        "longest SSE line parsed; longer ones are relayed but not parsed",
        "BYTES",
    ),
    Option(
        "inject_usage",
        "--inject-usage",
        "LLMOBS_INJECT_USAGE",
        _parse_bool,
        "ask OpenAI-dialect streams for usage (exact token counts) and strip the extra usage "
        "event before it reaches the client",
        "BOOL",
    ),
    Option(
        "token_events",
        "--token-events",
        "LLMOBS_TOKEN_EVENTS",
        int,
        "per-chunk span events kept on a request's decode span (stalls are always kept)",
        "N",
    ),
    Option(
        "token_spans",
        "--token-spans",
        "LLMOBS_TOKEN_SPANS",
        _parse_bool,
        "also emit a child span per output chunk (deep debugging; costly, see docs/tracing.md)",
        "BOOL",
    ),
    Option(
        "capture_content",
        "--capture-content",
        "LLMOBS_CAPTURE_CONTENT",
        _parse_bool,
        "put prompt and completion text on spans, truncated to 1024 characters (off: never)",
        "BOOL",
    ),
    Option(
        "shutdown_grace",
        "--shutdown-grace",
        "LLMOBS_SHUTDOWN_GRACE",
        float,
        "on SIGTERM: seconds in-flight streams may take to finish before they are ended cleanly",
        "SECONDS",
    ),
    Option(
        "metrics_token",
        "--metrics-token",
        "LLMOBS_METRICS_TOKEN",
        str,
        "if set, /metrics requires 'Authorization: Bearer <token>' (health probes stay open)",
        "TOKEN",
    ),
    Option(
        "instrument",
        "--instrument",
        "LLMOBS_INSTRUMENT",
        _parse_bool,
        "observe streams (false: a bare relay, to measure instrumentation cost)",
        "BOOL",
    ),
    Option(
        "event_loop",
        "--event-loop",
        "LLMOBS_EVENT_LOOP",
        str,
        "event loop: auto (uvloop when installed, the 'fast' extra), uvloop, asyncio",
        "LOOP",
    ),
    Option(
        "log_level",
        "--log-level",
        "LLMOBS_LOG_LEVEL",
        str,
        "log level: debug, info, warning, error",
        "LEVEL",
    ),
    # Collectors (docs/gpu.md): GPU via NVML, the engine's own /metrics, MBU and MFU.
    Option(
        "gpus",
        "--gpus",
        "LLMOBS_GPUS",
        _parse_list,
        "GPUs to report: NVML indices or GPU-/MIG- UUIDs, comma-separated (default: "
        "CUDA_VISIBLE_DEVICES, else NVIDIA_VISIBLE_DEVICES, else all)",
        "LIST",
    ),
    Option(
        "gpu_sample_interval",
        "--gpu-sample-interval",
        "LLMOBS_GPU_SAMPLE_INTERVAL",
        float,
        "seconds between NVML samples (0: no GPU collector)",
        "SECONDS",
    ),
    Option(
        "gpu_peak_bandwidth",
        "--gpu-peak-bandwidth",
        "LLMOBS_GPU_PEAK_BANDWIDTH",
        _parse_quantity,
        "peak memory bandwidth per GPU in bytes/s, e.g. 3.35T (default: from NVML)",
        "BYTES_PER_S",
    ),
    Option(
        "gpu_peak_flops",
        "--gpu-peak-flops",
        "LLMOBS_GPU_PEAK_FLOPS",
        _parse_quantity,
        "peak dense FLOP/s per GPU for the model's dtype, e.g. 989T (needed for MFU)",
        "FLOPS",
    ),
    Option(
        "engine_metrics_url",
        "--engine-metrics-url",
        "LLMOBS_ENGINE_METRICS_URL",
        str,
        "the engine's Prometheus endpoint (default: the upstream's /metrics)",
        "URL",
    ),
    Option(
        "engine_scrape_interval",
        "--engine-scrape-interval",
        "LLMOBS_ENGINE_SCRAPE_INTERVAL",
        float,
        "seconds between scrapes of the engine's /metrics (0: no engine collector)",
        "SECONDS",
    ),
    Option(
        "model_bytes",
        "--model-bytes",
        "LLMOBS_MODEL_BYTES",
        _parse_size,
        "bytes of weights read per decode step, for MBU (default: params x dtype size)",
        "BYTES",
    ),
    Option(
        "model_params",
        "--model-params",
        "LLMOBS_MODEL_PARAMS",
        _parse_quantity,
        "parameter count, e.g. 8B, for MBU and MFU",
        "N",
    ),
    Option(
        "weight_dtype",
        "--weight-dtype",
        "LLMOBS_WEIGHT_DTYPE",
        str,
        "weight storage type: fp32, fp16, bf16, fp8, int8, int4, fp4",
        "DTYPE",
    ),
    Option(
        "model_layers",
        "--model-layers",
        "LLMOBS_MODEL_LAYERS",
        int,
        "transformer layers, for the KV-cache bytes of MBU (0: weights only)",
        "N",
    ),
    Option(
        "model_kv_heads",
        "--model-kv-heads",
        "LLMOBS_MODEL_KV_HEADS",
        int,
        "key/value heads per layer (GQA), for the KV-cache bytes",
        "N",
    ),
    Option(
        "model_head_dim",
        "--model-head-dim",
        "LLMOBS_MODEL_HEAD_DIM",
        int,
        "dimension of one attention head, for the KV-cache bytes",
        "N",
    ),
    Option(
        "kv_dtype",
        "--kv-dtype",
        "LLMOBS_KV_DTYPE",
        str,
        "KV-cache element type: auto (the activation dtype), fp16, bf16, fp8, ...",
        "DTYPE",
    ),
)

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True)
class Settings:
    """The sidecar's whole configuration. Build with ``from_sources``; never mutate."""

    upstream: str = "http://127.0.0.1:8000"
    host: str = "0.0.0.0"
    port: int = 8080
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9464
    connect_timeout: float = 10.0
    upstream_idle_timeout: float = 4.0
    read_timeout: float = 300.0
    client_timeout: float = 60.0
    max_body_bytes: int = 16 * 1024**2
    max_models: int = 32
    stall_factor: float = 3.0
    stall_min_gap: float = 0.05
    max_line_bytes: int = 1024**2
    inject_usage: bool = False
    token_events: int = 256
    token_spans: bool = False
    capture_content: bool = False
    shutdown_grace: float = 60.0
    metrics_token: str = field(default="", repr=False)  # a secret: never printed
    instrument: bool = True
    event_loop: str = "auto"
    log_level: str = "info"
    gpus: tuple[str, ...] = ()
    gpu_sample_interval: float = 1.0
    gpu_peak_bandwidth: float | None = None
    gpu_peak_flops: float | None = None
    engine_metrics_url: str = ""
    engine_scrape_interval: float = 5.0
    model_bytes: int | None = None
    model_params: float | None = None
    weight_dtype: str = "bf16"
    model_layers: int = 0
    model_kv_heads: int = 0
    model_head_dim: int = 0
    kv_dtype: str = "auto"
    # Not options: the CUDA/NVIDIA runtime's variables, read by ``from_sources`` (docs/gpu.md).
    cuda_visible_devices: str | None = None
    nvidia_visible_devices: str | None = None

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def from_sources(
        cls, environ: Mapping[str, str], flags: Mapping[str, Any] | None = None
    ) -> Settings:
        """Merge CLI flags (values that are not None) over environment over defaults."""
        return cls(**merge_sources(OPTIONS, environ, flags), **visible_devices(environ))

    @property
    def upstream_base(self) -> str:
        """The upstream URL without a trailing slash, ready to prefix request paths."""
        return self.upstream.rstrip("/")


def merge_sources(
    options: tuple[Option, ...], environ: Mapping[str, str], flags: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Values given by flag (not None) or environment, converted; defaults are the caller's."""
    flags = flags or {}
    values: dict[str, Any] = {}
    for opt in options:
        given = flags.get(opt.field)
        if given is not None:
            values[opt.field] = _convert(opt, given, opt.flag)
        elif opt.env in environ:
            values[opt.field] = _convert(opt, environ[opt.env], opt.env)
    return values


def _convert(opt: Option, raw: Any, source: str) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return opt.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: invalid value {raw!r}: {exc}") from exc


def source_of(field: str, options: tuple[Option, ...] = OPTIONS) -> str:
    """How a user sets ``field``: "--flag / ENV_VAR", for error messages."""
    for opt in options:
        if opt.field == field:
            return f"{opt.flag} / {opt.env}"
    return field  # pragma: no cover


def _source(field: str) -> str:
    return source_of(field)


def _validate(s: Settings) -> None:
    parts = urlsplit(s.upstream)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{_source('upstream')}: expected an http(s) URL, got {s.upstream!r}")
    for name in ("port", "metrics_port"):
        value = getattr(s, name)
        if not 0 <= value <= 65535:
            raise ConfigError(f"{_source(name)}: port out of range: {value}")
    if s.shutdown_grace < 0:
        raise ConfigError(f"{_source('shutdown_grace')}: must be >= 0")
    for name in (
        "connect_timeout", "upstream_idle_timeout", "read_timeout", "client_timeout",
        "stall_factor",
    ):  # fmt: skip
        if getattr(s, name) <= 0:
            raise ConfigError(f"{_source(name)}: must be > 0, got {getattr(s, name)}")
    if s.stall_min_gap < 0:
        raise ConfigError(f"{_source('stall_min_gap')}: must be >= 0")
    for name in ("max_body_bytes", "max_models", "max_line_bytes"):
        if getattr(s, name) < 1:
            raise ConfigError(f"{_source(name)}: must be >= 1, got {getattr(s, name)}")
    if s.event_loop not in EVENT_LOOPS:
        raise ConfigError(f"{_source('event_loop')}: expected one of {', '.join(EVENT_LOOPS)}")
    if s.log_level.lower() not in _LOG_LEVELS:
        raise ConfigError(f"{_source('log_level')}: expected one of {', '.join(_LOG_LEVELS)}")
    _validate_collectors(s)


def visible_devices(environ: Mapping[str, str]) -> dict[str, Any]:
    """The GPU selection the CUDA and NVIDIA container runtimes were given, if any."""
    names = {"CUDA_VISIBLE_DEVICES": "cuda_visible_devices",
             "NVIDIA_VISIBLE_DEVICES": "nvidia_visible_devices"}  # fmt: skip
    found: dict[str, Any] = {f: environ[v] for v, f in names.items() if v in environ}
    return found


def _validate_collectors(s: Settings) -> None:
    for name in ("gpu_sample_interval", "engine_scrape_interval", "model_layers",
                 "model_kv_heads", "model_head_dim"):  # fmt: skip
        if getattr(s, name) < 0:
            raise ConfigError(f"{_source(name)}: must be >= 0, got {getattr(s, name)}")
    for name in ("gpu_peak_bandwidth", "gpu_peak_flops", "model_bytes", "model_params"):
        value = getattr(s, name)
        if value is not None and not value > 0:
            raise ConfigError(f"{_source(name)}: must be > 0, got {value}")
    if s.weight_dtype not in DTYPE_BYTES:
        raise ConfigError(f"{_source('weight_dtype')}: expected one of {', '.join(DTYPE_BYTES)}")
    if s.kv_dtype not in KV_DTYPES:
        raise ConfigError(f"{_source('kv_dtype')}: expected one of {', '.join(KV_DTYPES)}")
    if s.engine_metrics_url:
        parts = urlsplit(s.engine_metrics_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{_source('engine_metrics_url')}: expected an http(s) URL")


def add_arguments(
    parser: argparse.ArgumentParser,
    options: tuple[Option, ...] = OPTIONS,
    defaults_from: type[Any] = Settings,
) -> None:
    """Add one flag per option; defaults stay None so the environment can fill them."""
    defaults = {f.name: f.default for f in dataclasses.fields(defaults_from)}
    for opt in options:
        parser.add_argument(
            opt.flag,
            dest=opt.field,
            default=None,
            metavar=opt.metavar or None,
            help=f"{opt.help} [env {opt.env}; default {defaults[opt.field]}]",
        )


def flags_of(args: argparse.Namespace, options: tuple[Option, ...] = OPTIONS) -> dict[str, Any]:
    """The values of ``options`` found on parsed arguments."""
    return {o.field: getattr(args, o.field, None) for o in options}


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Build Settings from parsed CLI arguments and the environment."""
    return Settings.from_sources(environ, flags_of(args))


# --- OpenTelemetry SDK configuration: the standard OTEL_* variables, read here only ---------


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


def otel_settings(environ: Mapping[str, str]) -> OtelSettings:
    """Read the standard OpenTelemetry environment variables once; fail naming the variable."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return OtelSettings(metrics_exporters=("prometheus",))
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
        bsp_max_queue_size=int(_number(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)),
        bsp_schedule_delay_s=_number(environ, "OTEL_BSP_SCHEDULE_DELAY", 1000.0) / 1000,
        bsp_max_export_batch_size=int(_number(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
    )
