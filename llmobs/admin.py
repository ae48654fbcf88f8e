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
from prometheus_client import CollectorRegistry

from llmobs.collectors import Collectors
from llmobs.config.settings import Settings
from llmobs.export.metrics.exposition import accepts_gzip, negotiate, render
from llmobs.export.telemetry import Telemetry
from llmobs.export.ui import LivePage, add_routes
from llmobs.wire.tls import EngineTls

SESSION = web.AppKey("session", aiohttp.ClientSession)

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


class _Admin:
    """The admin port's handlers and what they share: the token, the registry, the render
    thread, the sidecar's lifecycle and the session /readyz asks the engine with."""

    def __init__(
        self,
        settings: Settings,
        registry: CollectorRegistry,
        lifecycle: Lifecycle,
        engine_tls: EngineTls | None = None,
    ) -> None:
        self.settings = settings
        self.engine_tls = engine_tls
        self.registry = registry
        self.lifecycle = lifecycle
        # One rendering thread: concurrent scrapes queue instead of collecting in parallel
        # (the OpenTelemetry exporter's collector is not safe to run twice at once).
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmobs-metrics")

    def allowed(self, request: web.Request) -> bool:
        """Whether the request may read the metrics (and the live page): no token set, or
        the token given."""
        token = self.settings.metrics_token
        return not token or _authorized(request.headers.get("Authorization", ""), token)

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.allowed(request):
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
        body = await render(fmt, self.registry, self.pool)
        # gzip when the scraper takes it (Prometheus does): compressed in the rendering
        # thread, which zlib runs without the GIL (docs/benchmarks.md, "/metrics in gzip")
        resp = web.Response(body=body, zlib_executor=self.pool, zlib_executor_size=GZIP_INLINE)
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            resp.enable_compression(web.ContentCoding.gzip)
        resp.headers["Content-Type"] = fmt.value
        resp.headers["Vary"] = "Accept, Accept-Encoding"
        return resp

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.lifecycle.draining:  # shutting down: out of the Service's endpoints
            return web.json_response({"status": "unready", "detail": "draining"}, status=503)
        session = request.app[SESSION]
        url = self.settings.upstream_base + "/health"
        tls = self.engine_tls.request_args(url) if self.engine_tls is not None else {}
        limit = aiohttp.ClientTimeout(total=READY_TIMEOUT)
        try:
            async with session.get(url, timeout=limit, **tls) as r:
                ready = r.status < 500
                detail = f"upstream answered {r.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            ready, detail = False, f"upstream unreachable: {type(exc).__name__}"
        return web.json_response(
            {"status": "ready" if ready else "unready", "detail": detail},
            status=200 if ready else 503,
        )

    async def session_ctx(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: the session while the application runs; the render thread
        ends with it."""
        async with _client_session(limit=4) as session:
            app[SESSION] = session
            yield
        self.pool.shutdown(wait=True)


def build_admin_app(
    settings: Settings,
    telemetry: Telemetry,
    collectors: Collectors | None = None,
    lifecycle: Lifecycle | None = None,
    live: LivePage | None = None,
    engine_tls: EngineTls | None = None,
) -> web.Application:
    """/metrics (Prometheus text, or OpenMetrics with exemplars when the scraper asks for
    it), /healthz (the sidecar), /readyz (the upstream answers, asked over ``engine_tls``
    for an https one), and the live page (/ui)."""
    app = web.Application()
    admin = _Admin(settings, telemetry.registry, lifecycle or Lifecycle(), engine_tls)
    app.cleanup_ctx.append(admin.session_ctx)
    if collectors is not None:  # polled in the background while the admin app runs
        app.cleanup_ctx.append(collectors.lifecycle)
    app.router.add_get("/metrics", admin.metrics)
    app.router.add_get("/healthz", admin.healthz)
    app.router.add_get("/readyz", admin.readyz)
    if live is not None:
        app.cleanup_ctx.append(live.lifecycle)
        add_routes(app, live, admin.allowed)
    return app
