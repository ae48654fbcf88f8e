"""The admin application: /metrics, /healthz, /readyz and the live page, on the admin port.

Its own module because it is the sidecar's other application: aiohttp, not the relay's
server, and nothing of the data path. Its state lives under ``web.AppKey`` and its
lifecycles in ``cleanup_ctx``, so tests build as many as they like. The sidecar's own
metrics are on the admin port only; the proxy port forwards every path, ``/metrics``
included, to the engine. Rendering /metrics runs in a worker thread so that a scrape (tens
of ms for a large exposition) does not hold up the relay's event loop.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from llmobs.collectors import Collectors
from llmobs.config.settings import Settings
from llmobs.export.metrics.exposition import accepts_gzip, negotiate, render
from llmobs.export.telemetry import Telemetry
from llmobs.export.ui import LivePage, add_routes

SESSION = web.AppKey("session", aiohttp.ClientSession)
COLLECTORS = web.AppKey("collectors", Collectors)

READY_TIMEOUT = 2.0
GZIP_INLINE = 4096  # a /metrics body smaller than this is compressed on the loop itself


def _client_session(limit: int = 0) -> aiohttp.ClientSession:
    """A pooled session that never rewrites bodies (no decompression, no cookies)."""
    connector = aiohttp.TCPConnector(limit=limit, enable_cleanup_closed=False)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
    )


def _authorized(given: str, token: str) -> bool:
    """Whether an ``Authorization`` value carries the token: ``Bearer <token>`` (scrapers,
    scripts), or HTTP Basic with it as the password (what a browser sends once it has asked:
    the live page). aiohttp keeps bytes that are not UTF-8 as surrogates; such a value is no
    token of ours (401, not a 500)."""
    try:
        raw = given.encode("utf-8")
    except UnicodeEncodeError:
        return False
    expected = token.encode("utf-8")
    scheme, _, credentials = raw.partition(b" ")
    if scheme.lower() == b"basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True)
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(decoded.partition(b":")[2], expected)
    return hmac.compare_digest(raw, b"Bearer " + expected)


@dataclass
class Lifecycle:
    """State both applications share: whether the sidecar is shutting down."""

    draining: bool = False


def build_admin_app(
    settings: Settings,
    telemetry: Telemetry,
    collectors: Collectors | None = None,
    lifecycle: Lifecycle | None = None,
    live: LivePage | None = None,
) -> web.Application:
    """/metrics (Prometheus text, or OpenMetrics with exemplars when the scraper asks for
    it), /healthz (the sidecar), /readyz (the upstream answers), and the live page (/ui)."""
    app = web.Application()
    lifecycle = lifecycle or Lifecycle()
    registry = telemetry.registry
    # One rendering thread: concurrent scrapes queue instead of collecting in parallel (the
    # OpenTelemetry exporter's collector is not safe to run twice at once).
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmobs-metrics")

    token = settings.metrics_token

    def allowed(request: web.Request) -> bool:
        return not token or _authorized(request.headers.get("Authorization", ""), token)

    async def metrics(request: web.Request) -> web.Response:
        if not allowed(request):
            return web.json_response(
                {"error": "a bearer token is required for /metrics"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="llmobs"'},
            )
        # The Prometheus text format unless the scraper asks for OpenMetrics (exemplars) or
        # protobuf (native histograms). The request series are written by their own renderer
        # on the event loop a part at a time (no GIL contention with a thread, no garbage to
        # collect: docs/benchmarks.md); other collectors render in the thread.
        fmt = negotiate(request.headers.get("Accept", ""))
        body = await render(fmt, registry, pool)
        content_type = fmt.value
        # gzip when the scraper takes it (Prometheus does): compressed in the rendering
        # thread, which zlib runs without the GIL (docs/benchmarks.md, "/metrics in gzip")
        resp = web.Response(body=body, zlib_executor=pool, zlib_executor_size=GZIP_INLINE)
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            resp.enable_compression(web.ContentCoding.gzip)
        resp.headers["Content-Type"] = content_type
        resp.headers["Vary"] = "Accept, Accept-Encoding"
        return resp

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        if lifecycle.draining:  # shutting down: take this pod out of the Service's endpoints
            return web.json_response({"status": "unready", "detail": "draining"}, status=503)
        session = request.app[SESSION]
        url = settings.upstream_base + "/health"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=READY_TIMEOUT)) as r:
                ready = r.status < 500
                detail = f"upstream answered {r.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            ready, detail = False, f"upstream unreachable: {type(exc).__name__}"
        return web.json_response(
            {"status": "ready" if ready else "unready", "detail": detail},
            status=200 if ready else 503,
        )

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        async with _client_session(limit=4) as session:
            app[SESSION] = session
            yield
        pool.shutdown(wait=True)

    app.cleanup_ctx.append(session_ctx)
    if collectors is not None:  # polled in the background while the admin app runs
        app[COLLECTORS] = collectors
        app.cleanup_ctx.append(collectors.lifecycle)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if live is not None:
        app.cleanup_ctx.append(live.lifecycle)
        add_routes(app, live, allowed)
    return app
