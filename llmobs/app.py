"""Assembly: the proxy (the relay on its own HTTP/1.1 server), the admin (metrics/health)
application, and serving them.

Dependencies go in through the builders (settings, telemetry); the admin app's state lives
under ``web.AppKey`` and its lifecycles in ``cleanup_ctx``, the proxy's in ``Proxy.start`` and
``stop``, so tests build as many independent sidecars as they like.

The sidecar's own metrics are on the admin port only; the proxy port forwards every path,
``/metrics`` included, to the engine. Rendering /metrics runs in a worker thread so that a
scrape (tens of ms for a large exposition) does not hold up the relay's event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gc
import hmac
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from llmobs.collectors import Collectors, NvmlBackend
from llmobs.config.settings import ConfigError, Settings
from llmobs.export.metrics.exposition import negotiate, render
from llmobs.export.metrics.sink import MetricsSink
from llmobs.export.telemetry import Telemetry
from llmobs.export.tracing import Arrival, RequestMeta, Tracing
from llmobs.export.ui import LivePage, add_routes
from llmobs.observe.dialects import Route
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.record import RequestConsumer
from llmobs.observe.timing import StreamStats, unparsed
from llmobs.relay.proxy import ObserverFactory, Relay
from llmobs.wire.listen import ListenError, listening
from llmobs.wire.server import ProxyServer
from llmobs.wire.upstream import Upstream

log = logging.getLogger("llmobs")

SESSION = web.AppKey("session", aiohttp.ClientSession)
COLLECTORS = web.AppKey("collectors", Collectors)

READY_TIMEOUT = 2.0
SWITCH_INTERVAL = 0.001


def tune_process() -> None:
    """Process-wide settings for serving; called by the CLI, never on import.

    Part of /metrics (the OpenTelemetry reader's families) is rendered in a worker thread,
    which holds the GIL while it formats: with CPython's default switch interval the relay's
    event loop would wait for it at each wake-up during a scrape (a delay users see as ITL);
    a short interval bounds that (docs/benchmarks.md). The request series are rendered on the
    loop itself, in parts.
    """
    sys.setswitchinterval(SWITCH_INTERVAL)
    # Everything imported so far lives as long as the process: keep it out of the collector's
    # reach, so that collections triggered by per-request garbage stay short.
    gc.freeze()


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``--event-loop`` asks for: None means asyncio's own.

    uvloop (libuv, Cython) roughly halves the per-chunk cost of the relay's reads, writes and
    task wake-ups (docs/benchmarks.md); ``auto`` takes it when installed (llmobs depends on
    it where it has wheels) and falls back to asyncio otherwise (Windows, PyPy).
    """
    if choice == "asyncio":
        return None
    try:
        import uvloop  # noqa: PLC0415 - absent where it has no wheels; imported only to serve
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop uvloop: uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _client_session(limit: int = 0) -> aiohttp.ClientSession:
    """A pooled session that never rewrites bodies (no decompression, no cookies)."""
    connector = aiohttp.TCPConnector(limit=limit, enable_cleanup_closed=False)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
    )


def observer_factory(
    settings: Settings,
    sink: MetricsSink,
    tracing: Tracing | None = None,
    consumers: Sequence[RequestConsumer] = (),
) -> ObserverFactory:
    """New ``Observer`` per request, sharing the sink (the first consumer of each request's
    record, and the keeper of the objectives it is judged by), the tracer, the consumers
    after the sink, and the settings' knobs."""
    config = ObserveSettings(
        stall_factor=settings.stall_factor,
        stall_min_gap=settings.stall_min_gap,
        max_line_bytes=settings.max_line_bytes,
        capture_content=settings.capture_content and tracing is not None,
        objectives=sink.objectives,
    )

    return _Observers(sink, config, tracing, tuple(consumers))


class _Observers:
    """``observer_factory``'s factory: ``traces`` says whether its observers add a trace
    context to the upstream request (the relay then makes them before sending it)."""

    __slots__ = ("_config", "_consumers", "_sink", "_tracing", "traces")

    def __init__(
        self,
        sink: MetricsSink,
        config: ObserveSettings,
        tracing: Tracing | None,
        consumers: tuple[RequestConsumer, ...],
    ) -> None:
        self._sink = sink
        self._config = config
        self._tracing = tracing
        self._consumers = consumers
        self.traces = tracing is not None

    def __call__(self, route: Route, start_ns: int, arrival: Arrival) -> Observer:
        tracing = self._tracing
        trace = None
        if tracing is not None:  # what a span needs of the request: made only for one
            meta = RequestMeta(arrival.method, arrival.path, arrival.headers, time.time_ns())
            trace = tracing.start(route, start_ns, meta)
        return Observer(self._sink, self._config, route, start_ns, trace, self._consumers)


def tracing_for(settings: Settings, telemetry: Telemetry) -> Tracing | None:
    """The request tracer, when the telemetry has tracing on."""
    tracer = telemetry.tracer
    if tracer is None:
        return None
    upstream = urlsplit(settings.upstream)
    return Tracing(
        tracer,
        token_events=settings.token_events,
        token_spans=settings.token_spans,
        capture_content=settings.capture_content,
        server_address=upstream.hostname or "",
        server_port=upstream.port or (443 if upstream.scheme == "https" else 80),
        on_drop=telemetry.spans_dropped,
        good_ratio=settings.traces_good_ratio,
    )


class Proxy:
    """The proxy port: one relay to ``settings.upstream`` for every method and path.

    Served by ``server.ProxyServer`` (HTTP/1.1 at the protocol level), not by aiohttp's web
    server: the relay is the hot path, and a framework's per-request objects cost more than
    the relaying itself (docs/benchmarks.md). Owns the upstream connection pool and the
    request tracer; ``start`` and ``stop`` bracket their lives.
    """

    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry,
        on_request: Callable[[str, StreamStats], None] | None = None,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.sink = MetricsSink(
            telemetry.registry, settings.max_models, on_request, push=telemetry.push_meter,
            objectives=settings.objectives(),
        )  # fmt: skip
        # What takes each finished request's record after the sink (which counts it first):
        # a new consumer is a class with ``consume(record)`` and one line here.
        self.consumers: list[RequestConsumer] = []
        self.tracing: Tracing | None = None
        self.relay: Relay | None = None
        self._upstream: Upstream | None = None
        self._server: ProxyServer | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port bound."""
        settings = self.settings
        self._upstream = Upstream(
            settings.upstream_base, settings.connect_timeout, settings.upstream_idle_timeout
        )
        self.tracing = tracing_for(settings, self.telemetry)
        factory = (
            observer_factory(settings, self.sink, self.tracing, self.consumers)
            if settings.instrument
            else None
        )
        self.relay = Relay(settings, self._upstream, factory)
        self._server = ProxyServer(
            self.relay,
            client_timeout=settings.client_timeout,
            max_body=settings.max_body_bytes,
            on_reject=self._rejected if settings.instrument else None,
        )
        return await self._server.listen(host, port)

    def _rejected(self, status: int, duration_s: float) -> None:
        """A request the server refused unparsed still ends in an outcome (``rejected``)."""
        self.sink.record_request(unparsed(status, duration_s))

    async def stop(self, grace: float) -> None:
        """Stop accepting; wait up to ``grace`` seconds for requests in flight; close the
        pool; write the last traces before the exporter shuts down."""
        if self._server is not None:
            await self._server.shutdown(grace)
            self._server = None
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None
        if self.relay is not None:
            self.relay.flush()
        tracing, self.tracing = self.tracing, None
        if tracing is not None:
            await asyncio.to_thread(tracing.close)


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
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        resp.headers["Vary"] = "Accept"
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


class Sidecar:
    """Both applications running on their sockets; ``await start()``, ``await stop()``."""

    def __init__(
        self, settings: Settings, telemetry: Telemetry, nvml: NvmlBackend | None = None
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.collectors = Collectors(settings, telemetry.meter, nvml)
        self.lifecycle = Lifecycle()
        self.proxy = Proxy(settings, telemetry, self.collectors.on_request)
        self.live: LivePage | None = None
        if settings.ui:
            self.live = LivePage(self.proxy.sink, self.collectors, settings.ui_history)
        self.admin = build_admin_app(
            settings, telemetry, self.collectors, self.lifecycle, self.live
        )
        self._runners: list[web.AppRunner] = []
        self.port = 0
        self.metrics_port = 0

    async def start(self) -> None:
        s = self.settings
        if self.telemetry.build_info is not None:  # the loop it runs on: uvloop or asyncio
            loop = type(asyncio.get_running_loop())
            self.telemetry.build_info.event_loop = loop.__module__.partition(".")[0]
        try:
            with listening(s.host, s.port):
                self.port = await self.proxy.start(s.host, s.port)
            with listening(s.metrics_host, s.metrics_port, "metrics_host", "metrics_port"):
                self.metrics_port = await self._serve(self.admin, s.metrics_host, s.metrics_port)
        except ListenError:
            await self.stop()  # what started: the upstream pool, the tracer, a port
            raise

    async def _serve(self, app: web.Application, host: str, port: int) -> int:
        # The admin port: aiohttp, with the proxy port's client timeout for idle connections.
        runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5,
            keepalive_timeout=self.settings.client_timeout,
        )
        await runner.setup()
        self._runners.append(runner)
        before = len(runner.addresses)
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        bound = runner.addresses[before:]
        return int(bound[0][1]) if bound else port

    def flush_records(self) -> None:
        """Record every finished request now (their recording waits for pending I/O)."""
        if self.proxy.relay is not None:
            self.proxy.relay.flush()

    def flush_traces(self) -> None:
        """Write every pending trace and export it now (blocking: tests, shutdown)."""
        self.flush_records()
        tracing = self.proxy.tracing
        if tracing is not None:
            tracing.drain()
        if self.telemetry.span_processor is not None:
            self.telemetry.span_processor.force_flush()

    async def stop(self) -> None:
        """Graceful shutdown: unready, stop accepting, let streams finish within the grace,
        end the rest cleanly, then flush traces and metrics."""
        if self.lifecycle.draining:
            return  # stopped already
        self.lifecycle.draining = True
        relay = self.proxy.relay
        grace = self.settings.shutdown_grace
        ending = None
        if relay is not None:
            ending = asyncio.get_running_loop().call_later(grace, relay.abort_streams)
        try:
            # The proxy first: the admin port stays up meanwhile. Streams the grace ended
            # finish cleanly at once; only a stuck handler waits the extra 5 s to be cancelled.
            await self.proxy.stop(grace + 5)
            for runner in self._runners:
                await runner.cleanup()
        finally:
            if ending is not None:
                ending.cancel()
            self._runners.clear()
            self.telemetry.shutdown()


async def run_until(
    settings: Settings, telemetry: Telemetry, stop: asyncio.Event,
    announce: Callable[[Sidecar], None] | None = None,
) -> None:  # fmt: skip
    """Serve until ``stop`` is set."""
    sidecar = Sidecar(settings, telemetry)
    await sidecar.start()
    if announce is not None:
        announce(sidecar)
    try:
        await stop.wait()
    finally:
        await sidecar.stop()
