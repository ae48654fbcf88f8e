"""The configuration that matters, said at start-up: the objectives and where they came from,
the tenants, the prices, each collector and why it is on or off, the transports; and a warning
for a value that looks like a unit mistake (``--slo-ttft 500``: 500 seconds).

Pure: lines from the settings and what the sidecar made of them (read files), for the CLI to
log. Nothing sensitive: file paths and counts, never a key, a fingerprint or a header's value.
"""

from __future__ import annotations

from llmobs.config.objectives import Objectives, ObjectiveSet
from llmobs.config.options import format_duration
from llmobs.config.prices import Prices
from llmobs.config.settings import Settings, source
from llmobs.config.tenants import Tenancy

# objectives above these, in seconds, look like milliseconds given without a unit
_LIKELY_MS = {"ttft": 60.0, "tpot": 10.0, "max_gap": 60.0}


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _bounds(objectives: ObjectiveSet) -> str:
    parts = [
        f"{name} <= {format_duration(value)}"
        for name, value in (
            ("TTFT", objectives.ttft), ("TPOT", objectives.tpot),
            ("longest gap", objectives.max_gap), ("duration", objectives.duration),
        )
        if value is not None
    ]  # fmt: skip
    if objectives.no_stalls:
        parts.append("no stalls")
    what = ", ".join(parts) if parts else "availability only (no latency bound set)"
    return f"{what}; target {objectives.target:.2%} over {format_duration(objectives.window)}"


def objectives_line(settings: Settings, objectives: Objectives) -> str:
    line = f"objectives: {_bounds(objectives.default)} (flags)"
    if settings.slo_file:
        n = len(objectives.overrides)
        line += f"; {_count(n, 'override')} from --slo-file {settings.slo_file}"
    return line


def tenants_line(tenancy: Tenancy) -> str:
    if not tenancy.on:
        return "tenants: off (--tenant-header, --tenant-keys)"
    how = []
    if tenancy.header:
        how.append(f"the {tenancy.header} header")
    if tenancy.keys:
        how.append(f"{_count(len(tenancy.keys), 'key')} named in --tenant-keys")
    if tenancy.fingerprints:
        how.append("other keys by fingerprint")
    return f"tenants: by {', '.join(how)}; on {', '.join(tenancy.metrics) or 'no family'}"


def prices_line(settings: Settings, prices: Prices | None) -> str:
    if prices is None:
        return "prices: off (--price-file)"
    return (
        f"prices: {_count(len(prices.models), 'model')} from --price-file {settings.price_file}, "
        f"in {prices.currency}"
    )


def collectors_line(settings: Settings) -> str:
    gpu = (
        f"GPU every {format_duration(settings.gpu_sample_interval)}"
        if settings.gpu_sample_interval > 0
        else "GPU off (--gpu-sample-interval 0)"
    )
    if settings.engine_scrape_interval > 0:
        url = settings.engine_metrics_url or settings.upstream_base + "/metrics"
        engine = f"the engine's {url} every {format_duration(settings.engine_scrape_interval)}"
    else:
        engine = "the engine's metrics off (--engine-scrape-interval 0)"
    return f"collectors: {gpu}; {engine}"


def transports_line(settings: Settings) -> str:
    proxy = "HTTP/1.1" + (" and HTTP/2" if settings.http2 else "")
    if settings.tls_cert_file:
        client = " with client certificates" if settings.tls_client_ca_file else ""
        proxy += f" over TLS{client} ({settings.tls_cert_file})"
    elif settings.http2:
        proxy += " (h2c)"
    if settings.websocket:
        limit, idle = settings.websocket_max_message_bytes, settings.websocket_idle_timeout
        proxy += f", WebSocket (messages to {limit} bytes, idle {idle:g} s)"
    metrics = "TLS" if settings.metrics_tls else "plain HTTP"
    engine = "https" if settings.upstream.lower().startswith("https://") else "plain HTTP"
    if settings.upstream_http2:
        engine += " over HTTP/2" if engine == "https" else " over HTTP/2 (h2c)"
    if settings.upstream_insecure_skip_verify:
        engine += ", its certificate NOT checked"
    return f"transports: clients {proxy}; metrics port {metrics}; engine {engine}"


def unit_warnings(objectives: ObjectiveSet) -> list[str]:
    """A latency objective so large it was likely meant in milliseconds."""
    out = []
    for name, limit in _LIKELY_MS.items():
        value = getattr(objectives, name)
        if value is not None and value > limit:
            out.append(
                f"{source('slo_' + name)} is {value:g} seconds; if you meant milliseconds, "
                f"write {value:g}ms"
            )
    return out


def configuration(
    settings: Settings, objectives: Objectives, tenancy: Tenancy, prices: Prices | None
) -> list[str]:
    """The lines said at start, in order."""
    return [
        objectives_line(settings, objectives),
        tenants_line(tenancy),
        prices_line(settings, prices),
        collectors_line(settings),
        transports_line(settings),
    ]
