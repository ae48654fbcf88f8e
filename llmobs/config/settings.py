"""Configuration of the sidecar: one frozen ``Settings``, read once at start-up.

Every option exists as a CLI flag and as an ``LLMOBS_*`` environment variable (twelve-factor),
declared once, as a field of ``Settings`` (``options.option``), so that ``--help``, the README
table and the parser cannot drift apart. Precedence: flag > environment > default. What a valid
value is stands beside each option too (``check=``, ``config.checks``); a bad value fails at
start-up naming its flag and variable, as do the two rules that bind several options (the
ports, the objectives). This is the only module that
reads the sidecar's settings from the environment, and it reads an injected mapping, never
``os.environ`` directly (the OpenTelemetry SDK's own ``OTEL_*`` variables: ``otel_config``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmobs.config.buckets import FAMILIES as BUCKET_FAMILIES
from llmobs.config.buckets import parse_buckets
from llmobs.config.checks import (
    at_least_one,
    between,
    fraction,
    http_url,
    matches,
    non_negative,
    one_of,
    positive,
    tcp_port,
    unless_empty,
)
from llmobs.config.model import DTYPE_BYTES, KV_DTYPES
from llmobs.config.objectives import (
    DEFAULT_TARGET,
    DEFAULT_WINDOW,
    ObjectiveError,
    Objectives,
    ObjectiveSet,
    build_objectives,
)
from llmobs.config.options import (
    ConfigError,
    check_fields,
    flags_of,
    merge_sources,
    option,
    options_of,
    parse_bool,
    parse_duration,
    parse_list,
    parse_quantity,
    parse_size,
    source_of,
)
from llmobs.config.options import add_arguments as _add_arguments
from llmobs.config.prices import Prices, load_prices
from llmobs.config.tenants import DEFAULT_METRICS as DEFAULT_TENANT_METRICS
from llmobs.config.tenants import METRIC_NAMES as TENANT_METRIC_NAMES
from llmobs.config.tenants import Tenancy, check_metrics, load_keys
from llmobs.config.transports import check_tls

__all__ = ["OPTIONS", "ConfigError", "Settings", "add_arguments", "settings_from_args"]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# a label value, bounded and plain, as the conventions' own are
_PROVIDER = matches(
    r"[a-z][a-z0-9_.]{0,63}",
    "auto or a name of lower-case letters, digits, '.' and '_' (as the conventions' own: "
    "aws.bedrock)",
)


def _optional_url(value: str) -> str | None:
    """An http(s) URL, or nothing."""
    return http_url(value) if value else None


@dataclass(frozen=True)
class Settings:
    """The sidecar's whole configuration. Build with ``from_sources``; never mutate. Every
    field but the last two is an option (collectors' ones: docs/gpu.md; objectives'
    docs/slo.md)."""

    upstream: str = option(
        "http://127.0.0.1:8000", str,
        "base URL of the inference server every request is forwarded to", "URL", check=http_url,
    )  # fmt: skip
    host: str = option("0.0.0.0", str, "address the proxy listens on", "ADDR")
    port: int = option(
        8080, int, "port the proxy listens on (clients talk to it as to the engine)", "PORT",
        check=tcp_port,
    )  # fmt: skip
    metrics_host: str = option("0.0.0.0", str, "address of the metrics/health server", "ADDR")
    metrics_port: int = option(
        9464, int, "port serving /metrics, /healthz and /readyz", "PORT", check=tcp_port
    )
    http2: bool = option(
        True, parse_bool, "accept HTTP/2 on the proxy port: with prior knowledge (h2c, as a "
        "gateway's h2c pool sends it) and by ALPN over TLS; each stream measured as a request",
        "BOOL",
    )  # fmt: skip
    # TLS (docs/deploy.md): the listener's files are checked every few seconds and a changed
    # certificate serves the next connections (streams in flight keep theirs).
    tls_cert_file: str = option(
        "", str, "serve the proxy port over TLS with this PEM certificate chain (HTTP/2 by "
        "ALPN); reloaded when it changes", "PATH",
    )  # fmt: skip
    tls_key_file: str = option("", str, "the certificate's PEM private key", "PATH")
    tls_client_ca_file: str = option(
        "", str, "require client certificates signed by these PEM CAs (mTLS) on the proxy port",
        "PATH",
    )  # fmt: skip
    metrics_tls: bool = option(
        False, parse_bool, "serve the metrics port over TLS too, with the same certificate "
        "(no client certificate asked: probes and --metrics-token still work)", "BOOL",
    )  # fmt: skip
    upstream_ca_file: str = option(
        "", str, "PEM CAs an https engine's certificate is checked against (default: the "
        "system's trust store)", "PATH",
    )  # fmt: skip
    upstream_server_name: str = option(
        "", str, "the name sent to an https engine (SNI) and checked in its certificate "
        "(default: the --upstream URL's host)", "NAME",
    )  # fmt: skip
    upstream_cert_file: str = option(
        "", str, "a PEM client certificate shown to an https engine (mTLS)", "PATH"
    )
    upstream_key_file: str = option("", str, "the client certificate's PEM private key", "PATH")
    upstream_insecure_skip_verify: bool = option(
        False, parse_bool, "do not check an https engine's certificate at all (a pod's "
        "self-signed one); logged as a warning at start", "BOOL",
    )  # fmt: skip
    upstream_http2: bool = option(
        False, parse_bool, "speak HTTP/2 to the engine: h2c with prior knowledge to an http "
        "--upstream, h2 by ALPN to an https one; each request a stream (WebSocket upgrades "
        "and the engine collector stay on HTTP/1.1)", "BOOL",
    )  # fmt: skip
    connect_timeout: float = option(
        10.0, float, "seconds to wait for a connection to the upstream (then 504)", "SECONDS",
        check=positive,
    )  # fmt: skip
    upstream_idle_timeout: float = option(
        4.0, float,
        "seconds an idle connection to the upstream is kept for reuse; keep it below the "
        "engine's own keep-alive timeout (uvicorn's and llama.cpp's: 5 s)", "SECONDS",
        check=positive,
    )  # fmt: skip
    read_timeout: float = option(
        300.0, float,
        "seconds the upstream may stay silent, before headers (then 504) or between chunks "
        "(then the stream is cut)", "SECONDS", check=positive,
    )  # fmt: skip
    client_timeout: float = option(
        60.0, float,
        "seconds a client may take to send a request's headers, and in all to send its body "
        "(then the connection is closed, or 408), and to take any of a response it stopped "
        "reading (then it is closed): slow clients cannot hold the sidecar", "SECONDS",
        check=positive,
    )  # fmt: skip
    max_body_bytes: int = option(
        16 * 1024**2, parse_size,
        "largest request body accepted as it comes over the wire, chunked framing included "
        "(then 413); accepts KiB/MiB/GiB suffixes", "BYTES", check=at_least_one,
    )  # fmt: skip
    websocket: bool = option(
        True, parse_bool, "relay WebSocket upgrades (vLLM's /v1/realtime) with their handshake "
        "intact, each session measured; off: the Upgrade header is dropped as hop-by-hop",
        "BOOL",
    )  # fmt: skip
    websocket_max_message_bytes: int = option(
        16 * 1024**2, parse_size,
        "largest WebSocket message either way, inflated (as uvicorn's --ws-max-size): a "
        "larger one ends the session with 1009; accepts KiB/MiB/GiB suffixes", "BYTES",
        check=at_least_one,
    )  # fmt: skip
    websocket_idle_timeout: float = option(
        300.0, float,
        "seconds a WebSocket session may pass nothing either way (pings count) before it is "
        "closed with 1001", "SECONDS", check=positive,
    )  # fmt: skip
    # Disaggregated prefill and decode (docs/deploy.md, "One request, two pods")
    pd_roles: str = option(
        "auto", str.lower, "read each request's role in disaggregated prefill and decode "
        "(llm-d's x-prefiller-host-port header, vLLM's kv_transfer_params): auto, or off for a "
        "pod with no P/D, where a client could claim a leg's role", "MODE",
        check=one_of(("auto", "off")),
    )  # fmt: skip
    pd_decode_upstream: str = option(
        "", str, "the decode engine behind llm-d's routing sidecar: requests to "
        "--pd-decode-port go there, each a leg of a request counted at --port (point the "
        "sidecar's decoder at that port); empty: no such listener", "URL", check=_optional_url,
    )  # fmt: skip
    pd_decode_port: int = option(
        8201, int, "port of the decode engine's listener (with --pd-decode-upstream)", "PORT",
        check=tcp_port,
    )  # fmt: skip
    pd_prefill_upstream: str = option(
        "", str, "a prefill engine in this pod (one node serving both): requests to "
        "--pd-prefill-port go there, measured as at --port; empty: no such listener", "URL",
        check=_optional_url,
    )  # fmt: skip
    pd_prefill_port: int = option(
        8202, int, "port of the prefill engine's listener (with --pd-prefill-upstream)",
        "PORT", check=tcp_port,
    )  # fmt: skip
    pd_host: str = option(
        "127.0.0.1", str, "address the P/D listeners bind (the pod's own traffic: the routing "
        "sidecar beside it; another address lets other pods past the entry)", "ADDR",
    )  # fmt: skip
    max_models: int = option(
        32, int, "distinct model label values before new ones are reported as 'other'", "N",
        check=at_least_one,
    )  # fmt: skip
    stall_factor: float = option(
        3.0, float,
        "a gap between chunks is a stall when it exceeds this multiple of the request's "
        "median gap ...", "X", check=positive,
    )  # fmt: skip
    stall_min_gap: float = option(
        0.05, float, "... and is at least this many seconds", "SECONDS", check=non_negative
    )
    max_line_bytes: int = option(
        1024**2, parse_size, "longest SSE line parsed; longer ones are relayed but not parsed",
        "BYTES", check=at_least_one,
    )  # fmt: skip
    inject_usage: bool = option(
        False, parse_bool,
        "ask OpenAI-dialect streams for usage (exact token counts) and strip the extra usage "
        "event before it reaches the client", "BOOL",
    )  # fmt: skip
    token_events: int = option(
        256, int, "per-chunk span events kept on a request's decode span (stalls are always kept)",
        "N",
    )  # fmt: skip
    token_spans: bool = option(
        False, parse_bool,
        "also emit a child span per output chunk (deep debugging; costly, see docs/tracing.md)",
        "BOOL",
    )  # fmt: skip
    capture_content: bool = option(
        False, parse_bool,
        "put prompt and completion text on spans, truncated to 1024 characters (off: never)",
        "BOOL",
    )  # fmt: skip
    shutdown_grace: float = option(
        60.0, float,
        "on SIGTERM: seconds in-flight streams may take to finish before they are ended cleanly",
        "SECONDS", check=non_negative,
    )  # fmt: skip
    metrics_token: str = option(
        "", str,
        "if set, /metrics and the live page require it: 'Authorization: Bearer <token>', or "
        "HTTP Basic with it as the password (health probes stay open)", "TOKEN", secret=True,
    )  # fmt: skip
    ui: bool = option(
        True, parse_bool,
        "serve the live page (/ui on the metrics port): the last minutes, a point a second", "BOOL",
    )  # fmt: skip
    ui_history: int = option(
        600, int, "seconds the live page keeps (one point a second, ~1 KB each)", "SECONDS",
        check=between(10, 3600, "seconds"),
    )  # fmt: skip
    instrument: bool = option(
        True, parse_bool, "observe streams (false: a bare relay, to measure instrumentation cost)",
        "BOOL",
    )  # fmt: skip
    event_loop: str = option(
        "auto", str,
        "event loop: auto (uvloop when installed, as it is with llmobs on Linux and macOS), "
        "uvloop, asyncio", "LOOP", check=one_of(EVENT_LOOPS),
    )  # fmt: skip
    log_level: str = option(
        "info", str, "log level: debug, info, warning, error", "LEVEL",
        check=one_of(LOG_LEVELS, fold=True),
    )  # fmt: skip
    gpus: tuple[str, ...] = option(
        (), parse_list,
        "GPUs to report: NVML indices or GPU-/MIG- UUIDs, comma-separated (default: "
        "CUDA_VISIBLE_DEVICES, else NVIDIA_VISIBLE_DEVICES, else all)", "LIST",
    )  # fmt: skip
    gpu_sample_interval: float = option(
        1.0, float, "seconds between NVML samples (0: no GPU collector)", "SECONDS",
        check=non_negative,
    )  # fmt: skip
    gpu_peak_bandwidth: float | None = option(
        None, parse_quantity,
        "peak memory bandwidth per GPU in bytes/s, e.g. 3.35T (default: from NVML)", "BYTES_PER_S",
        check=positive,
    )  # fmt: skip
    gpu_peak_flops: float | None = option(
        None, parse_quantity,
        "peak dense FLOP/s per GPU for the model's dtype, e.g. 989T (needed for MFU)", "FLOPS",
        check=positive,
    )  # fmt: skip
    engine_metrics_url: str = option(
        "", str, "the engine's Prometheus endpoint (default: the upstream's /metrics)", "URL",
        check=unless_empty(http_url),
    )  # fmt: skip
    engine_scrape_interval: float = option(
        5.0, float, "seconds between scrapes of the engine's /metrics (0: no engine collector)",
        "SECONDS", check=non_negative,
    )  # fmt: skip
    model_bytes: int | None = option(
        None, parse_size,
        "bytes of weights read per decode step, for MBU (default: params x dtype size)", "BYTES",
        check=positive,
    )  # fmt: skip
    model_params: float | None = option(
        None, parse_quantity, "parameter count, e.g. 8B, for MBU and MFU", "N", check=positive
    )
    weight_dtype: str = option(
        "bf16", str, "weight storage type: fp32, fp16, bf16, fp8, int8, int4, fp4", "DTYPE",
        check=one_of(DTYPE_BYTES),
    )  # fmt: skip
    model_layers: int = option(
        0, int, "transformer layers, for the KV-cache bytes of MBU (0: weights only)", "N",
        check=non_negative,
    )  # fmt: skip
    model_kv_heads: int = option(
        0, int, "key/value heads per layer (GQA), for the KV-cache bytes", "N", check=non_negative
    )
    model_head_dim: int = option(
        0, int, "dimension of one attention head, for the KV-cache bytes", "N", check=non_negative
    )
    kv_dtype: str = option(
        "auto", str, "KV-cache element type: auto (the activation dtype), fp16, bf16, fp8, ...",
        "DTYPE", check=one_of(KV_DTYPES),
    )  # fmt: skip
    # Service-level objectives (docs/slo.md): the default set; --slo-file overrides per model
    slo_ttft: float | None = option(
        None, parse_duration, "SLO: a good request's time to first token is at most this",
        "DURATION",
    )  # fmt: skip
    slo_tpot: float | None = option(
        None, parse_duration, "SLO: a good request's time per output token is at most this",
        "DURATION",
    )  # fmt: skip
    slo_max_gap: float | None = option(
        None, parse_duration, "SLO: a good request's longest gap between tokens is at most this",
        "DURATION",
    )  # fmt: skip
    slo_no_stalls: bool = option(
        False, parse_bool, "SLO: a good request has no stall (see --stall-factor)", "BOOL"
    )
    slo_duration: float | None = option(
        None, parse_duration, "SLO: a good request ends within this, end to end", "DURATION"
    )
    slo_target: float = option(
        DEFAULT_TARGET, float, "SLO: the share of requests that should be good", "RATIO"
    )
    slo_window: float = option(
        DEFAULT_WINDOW, parse_duration, "SLO: the window the target is measured over", "DURATION"
    )
    slo_file: str = option(
        "", str, "SLO: a YAML file of per-model, per-operation and per-tenant objectives "
        "(docs/slo.md)", "PATH",
    )  # fmt: skip
    tenant_header: str = option(
        "", str, "tenants: the request header whose value names the request's tenant "
        "(X-Tenant-Id); client-sent, so bounded as models are", "NAME",
    )  # fmt: skip
    tenant_keys: str = option(
        "", str, "tenants: a YAML file of API-key fingerprints and the tenant each names "
        "(`llmobs tenant-key` prints a key's; keys are never shown)", "PATH",
    )  # fmt: skip
    tenant_fingerprints: bool = option(
        False, parse_bool, "tenants: a key the --tenant-keys file does not name is labelled "
        "key-<12 hex digits of its SHA-256> when no --tenant-header value names the tenant "
        "(else unknown)", "BOOL",
    )  # fmt: skip
    max_tenants: int = option(
        32, int, "distinct tenant label values before new ones are reported as 'other' (the "
        "--tenant-keys file's names always have their own)", "N", check=at_least_one,
    )  # fmt: skip
    tenant_metrics: tuple[str, ...] = option(
        DEFAULT_TENANT_METRICS, parse_list, "tenants: the request families labelled by tenant: "
        f"some of {', '.join(TENANT_METRIC_NAMES)}", "LIST", check=check_metrics,
    )  # fmt: skip
    buckets: tuple[tuple[str, tuple[float, ...]], ...] = option(
        (), parse_buckets, "classic histogram bounds in seconds, per family: "
        "'ttft=0.1,0.25,0.5,1;itl=0.01,0.05,0.1' (families: " + ", ".join(BUCKET_FAMILIES)
        + "; the rest keep theirs; docs/metrics.md)", "SPEC",
    )  # fmt: skip
    price_file: str = option(
        "", str, "a YAML file of token prices per model and one currency: a cost counter "
        "by model (and tenant) (docs/metrics.md)", "PATH",
    )  # fmt: skip
    provider_name: str = option(
        "auto", str, "the gen_ai.provider.name on the GenAI metrics and spans: auto (the "
        "engine its metrics name; if they name none, Ollama or Triton from a request in its "
        "own API answered with a 2xx; else unknown) or a name, e.g. vllm", "NAME", check=_PROVIDER,
    )  # fmt: skip
    traces_good_ratio: float = option(
        1.0, float,
        "share of good requests' traces kept (sampled by trace id); bad ones are always kept",
        "RATIO", check=fraction,
    )  # fmt: skip
    # Not options: the CUDA/NVIDIA runtime's variables, read by ``from_sources`` (docs/gpu.md).
    cuda_visible_devices: str | None = None
    nvidia_visible_devices: str | None = None

    def __post_init__(self) -> None:
        check_fields(self, OPTIONS)  # each option's own bounds, then what binds several
        _check_ports(self)
        _check_pd(self)
        check_tls(lambda name: getattr(self, name), source)
        _check_objectives(self)

    @classmethod
    def from_sources(
        cls, environ: Mapping[str, str], flags: Mapping[str, Any] | None = None
    ) -> Settings:
        """Merge CLI flags (values that are not None) over environment over defaults."""
        return cls(**merge_sources(OPTIONS, environ, flags), **visible_devices(environ))

    def objectives(self) -> Objectives:
        """The service-level objectives: the default set, and the file's overrides (read)."""
        default = ObjectiveSet(
            ttft=self.slo_ttft, tpot=self.slo_tpot, max_gap=self.slo_max_gap,
            no_stalls=self.slo_no_stalls, duration=self.slo_duration, target=self.slo_target,
            window=self.slo_window,
        )  # fmt: skip
        return build_objectives(default, self.slo_file)

    def tenancy(self) -> Tenancy:
        """How tenants are found (the key file read), and the families labelled by them."""
        keys = load_keys(self.tenant_keys) if self.tenant_keys else {}
        return Tenancy(
            self.tenant_header.strip(), keys, self.tenant_fingerprints, self.tenant_metrics
        )

    def prices(self) -> Prices | None:
        """The price file's prices (read); None: no price file, no cost."""
        return load_prices(self.price_file) if self.price_file else None

    @property
    def upstream_base(self) -> str:
        """The upstream URL without a trailing slash, ready to prefix request paths."""
        return self.upstream.rstrip("/")


OPTIONS = options_of(Settings, "LLMOBS_")


def source(field: str) -> str:
    """How a sidecar setting is given: its flag and its variable."""
    return source_of(field, OPTIONS)


def _check_ports(s: Settings) -> None:
    wildcard = {"0.0.0.0", "::", ""}
    shared = s.host == s.metrics_host or {s.host, s.metrics_host} & wildcard
    if s.port == s.metrics_port != 0 and shared:  # the second bind would fail on the first
        raise ConfigError(
            f"{source('metrics_port')}: must differ from {source('port')} (both {s.port})"
        )


def _check_pd(s: Settings) -> None:
    """The decode engine's listener holds legs of the requests counted at the port: with
    roles not read, each would be counted twice."""
    if s.pd_decode_upstream and s.pd_roles == "off":
        raise ConfigError(
            f"{source('pd_decode_upstream')}: every request there is a leg of one counted at "
            f"{source('port')}, which {source('pd_roles')} off would count twice: drop one"
        )


def _check_objectives(s: Settings) -> None:
    try:  # the default set (checked by ObjectiveSet), then the file's entries
        s.objectives()
    except ObjectiveError as exc:  # a field of the default set: a flag's or variable's
        raise ConfigError(f"{source('slo_' + exc.field)}: {exc.message}") from None


def visible_devices(environ: Mapping[str, str]) -> dict[str, Any]:
    """The GPU selection the CUDA and NVIDIA container runtimes were given, if any."""
    names = {"CUDA_VISIBLE_DEVICES": "cuda_visible_devices",
             "NVIDIA_VISIBLE_DEVICES": "nvidia_visible_devices"}  # fmt: skip
    found: dict[str, Any] = {f: environ[v] for v, f in names.items() if v in environ}
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sidecar's flags (``llmobs serve``); defaults stay None so the environment can fill
    them."""
    _add_arguments(parser, OPTIONS)


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Build Settings from parsed CLI arguments and the environment."""
    return Settings.from_sources(environ, flags_of(args, OPTIONS))
