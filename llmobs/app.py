"""Assembly: the proxy (the relay on its own HTTP/1.1 server), the observers it makes, and
serving it beside the admin application (``admin``: metrics, health, the live page).

Dependencies go in through the builders (settings, telemetry); the proxy's lifecycle is in
``Proxy.start`` and ``stop``, the admin app's in its ``cleanup_ctx``, so tests build as many
independent sidecars as they like.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from aiohttp import web

from llmobs.admin import Lifecycle, build_admin_app
from llmobs.certificates import Certificates
from llmobs.collectors import Collectors, NvmlBackend
from llmobs.config.settings import ConfigError, Settings
from llmobs.config.tenants import Tenancy
from llmobs.export.metrics.apis import ApiMetrics
from llmobs.export.metrics.mapping import RequestMapping
from llmobs.export.metrics.otel import OtelMetrics
from llmobs.export.metrics.pd import PdMetrics
from llmobs.export.metrics.saturation import SaturationMetrics
from llmobs.export.metrics.sessions import SessionMetrics
from llmobs.export.metrics.sink import MetricsSink
from llmobs.export.metrics.transport import TransportMetrics
from llmobs.export.realtime import SessionExport, SessionTracing
from llmobs.export.telemetry import Telemetry
from llmobs.export.tracing import RequestMeta, Tracing
from llmobs.export.ui import LivePage
from llmobs.observe.causes import EngineTimeline
from llmobs.observe.dialects import OTHER_ROUTE, Route, route_for_grpc
from llmobs.observe.dialects.grpc import ServedModel
from llmobs.observe.disagg import PdJoin, PdSettings, Position, has_prefiller
from llmobs.observe.labels import LabelAdmission
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.provider import Provider
from llmobs.observe.record import Arrival, RequestConsumer
from llmobs.observe.recorder import Recorder
from llmobs.observe.saturation import Backlogs
from llmobs.observe.tenants import tenant_of
from llmobs.observe.timing import unparsed
from llmobs.relay.observing import ObserverFactory
from llmobs.relay.proxy import Relay
from llmobs.wire.accept import RESULTS
from llmobs.wire.h2.client import H2Upstream
from llmobs.wire.listen import ListenError, listening
from llmobs.wire.server import ProxyServer
from llmobs.wire.tls import EngineTls
from llmobs.wire.upstream import Upstream

log = logging.getLogger("llmobs")

SWITCH_INTERVAL = 0.001
# seconds the start waits for the engine collector's first scrape (the provider name)
FIRST_SCRAPE_WAIT = 3.0


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


def observer_factory(
    settings: Settings,
    recorder: Recorder,
    tracing: Tracing | None = None,
    timeline: EngineTimeline | None = None,
    tenancy: Tenancy | None = None,
    provider: Provider | None = None,
    pd: PdSettings | None = None,
    backlogs: Backlogs | None = None,
    served: ServedModel | None = None,
) -> ObserverFactory:
    """New ``Observer`` per request, sharing the recorder (where each request's record is
    made and delivered: the sink, then the consumers), the tracer, the engine's timeline
    (stall causes), the tenants' rules and the settings' knobs; the provider name learns from
    answered requests' dialects until settled; ``pd``: the listener's part in P/D (default:
    at the entry, roles read unless ``--pd-roles off``); ``backlogs``: the sidecar's prefill
    backlogs, by role (None: not measured); ``served``: the model an engine's gRPC API
    serves, learned from its answers (shared by the listeners: one engine's)."""
    if pd is None:
        pd = PdSettings(on=settings.pd_roles != "off")
    config = ObserveSettings(
        stall_factor=settings.stall_factor,
        stall_min_gap=settings.stall_min_gap,
        max_line_bytes=settings.max_line_bytes,
        capture_content=settings.capture_content and tracing is not None,
        provider=provider if provider is not None and not provider.settled else None,
        pd=pd if pd.on else None,
        backlogs=backlogs,
        served=served,
    )
    tenancy = tenancy if tenancy is not None and tenancy.on else None
    return _Observers(recorder, config, tracing, timeline, tenancy)


def engine_pool(
    settings: Settings, h1: Upstream, tls: EngineTls | None, always: bool = False
) -> H2Upstream | None:
    """The engine over HTTP/2 (``--upstream-http2``, or ``always``: gRPC's), addressed as
    HTTP/1.1's pool is; None: requests go on HTTP/1.1's."""
    if not settings.upstream_http2 and not always:
        return None
    h2 = tls.h2 if tls is not None and h1.https else None  # (https: always a context)
    server_name = tls.server_name if tls is not None else ""
    return H2Upstream(h1.host, h1.port, h1.host_header, settings.connect_timeout, h2, server_name)


class _Observers:
    """``observer_factory``'s factory: ``traces`` says whether its observers add a trace
    context to the upstream request (the relay then makes them before sending it)."""

    __slots__ = ("_config", "_pd", "_recorder", "_tenancy", "_timeline", "_tracing", "traces")

    def __init__(
        self,
        recorder: Recorder,
        config: ObserveSettings,
        tracing: Tracing | None,
        timeline: EngineTimeline | None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self._recorder = recorder
        self._timeline = timeline
        self._tenancy = tenancy
        self._config = config
        self._tracing = tracing
        pd = self._pd = config.pd
        # observers made before the request goes upstream when they add a trace context:
        # tracing's, or the one a disaggregated request's legs are joined by
        self.traces = tracing is not None or (pd is not None and pd.join is not None)

    def __call__(self, route: Route, start_ns: int, arrival: Arrival) -> Observer:
        if route is OTHER_ROUTE:  # (a gRPC method of no API measured: under gRPC's)
            route = route_for_grpc(route, arrival.headers.get("Content-Type", ""))
        tracing = self._tracing
        trace = None
        if tracing is not None:  # what a span needs of the request: made only for one
            meta = RequestMeta(arrival.method, arrival.path, arrival.headers, time.time_ns())
            trace = tracing.start(route, start_ns, meta)
        tenancy = self._tenancy  # whose request: read off its headers, the key not kept
        tenant = tenant_of(tenancy, arrival.headers) if tenancy is not None else None
        if self._pd is None:
            return Observer(
                self._recorder, self._config, route, start_ns, trace, self._timeline, tenant
            )
        headers = arrival.headers  # its part in P/D, read off its headers (none kept)
        return Observer(
            self._recorder, self._config, route, start_ns, trace, self._timeline, tenant,
            has_prefiller(headers), headers.get("traceparent"),
        )  # fmt: skip


def tracing_for(
    settings: Settings, telemetry: Telemetry, provider: Provider | None = None
) -> Tracing | None:
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
        provider=provider,
        latest=telemetry.genai_latest,
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
        consumers: Sequence[RequestConsumer] = (),
        certificates: Certificates | None = None,
    ) -> None:
        """``consumers`` take each finished request's record after the sink; ``certificates``
        (TLS on the port, to the engine) are the sidecar's, else read from the settings."""
        self.settings = settings
        self.telemetry = telemetry
        if certificates is None:
            certificates = Certificates(settings, TransportMetrics(telemetry.meter, RESULTS))
        self.certificates = certificates
        self.tenancy = settings.tenancy()
        self.prices = settings.prices()
        self.objectives = objectives = settings.objectives()
        # the gen_ai.provider.name: the operator's, or the engine's once found
        self.provider = Provider(settings.provider_name, settings.engine_scrape_interval > 0)
        # the request families and what a record observes in them: the series' and OTLP's
        mapping = RequestMapping(
            objectives, self.tenancy, self.prices.currency if self.prices is not None else "",
            settings.buckets, telemetry.genai_latest,
        )  # fmt: skip
        self.sink = MetricsSink(telemetry.registry, mapping, provider=self.provider.name)
        self.provider.subscribe(self.sink.set_provider)
        # What takes each finished request's record after the sink (which counts it first):
        # a new consumer is a class with ``consume(record)`` and one line here.
        consumers = [*consumers, ApiMetrics(telemetry.meter)]
        push = telemetry.push_meter
        if push is not None:  # request metrics pushed over OTLP too
            consumers.append(OtelMetrics(push, mapping, self.sink.live, self.provider))
        admission = LabelAdmission(settings.max_models, self.tenancy, settings.max_tenants)
        # disaggregated requests' legs, joined across this process's listeners when it has
        # more than one (``observe.disagg``); legs go to their own families alone
        self.join = PdJoin() if settings.pd_decode_upstream else None
        legs = [PdMetrics(telemetry.meter, self.join)]
        # where every request's record is made and delivered (refused ones' too)
        self.recorder = Recorder(self.sink, admission, objectives, self.prices, consumers, legs)
        self.session_metrics = SessionMetrics(telemetry.meter, settings.max_models)
        # the prompts waiting for a first token at each listener's engine, by P/D role
        self.backlogs = Backlogs()
        self.served = ServedModel()  # an engine's gRPC API's model (``observe.dialects.grpc``)
        SaturationMetrics(telemetry.meter, self.backlogs)
        # the engine's streams and preemptions, against which each stall is judged
        self.timeline = EngineTimeline()
        self.tracing: Tracing | None = None
        self.relay: Relay | None = None
        self._upstream: Upstream | None = None
        self._pool: H2Upstream | None = None
        self._grpc_pool: H2Upstream | None = None  # gRPC's, when requests go on HTTP/1.1
        self._server: ProxyServer | None = None
        # the P/D listeners (``--pd-decode-port``, ``--pd-prefill-port``): position, port bound
        self.pd_ports: dict[str, int] = {}
        self._extra: list[tuple[Upstream, Relay, ProxyServer]] = []
        self._extra_pools: list[H2Upstream] = []  # the P/D listeners' HTTP/2 pools

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port bound."""
        settings = self.settings
        tls = self.certificates
        self._upstream = Upstream(
            settings.upstream_base, settings.connect_timeout, settings.upstream_idle_timeout,
            tls.engine(),
        )  # fmt: skip
        self.tracing = tracing_for(settings, self.telemetry, self.provider)
        # at a decode pod's entry (the decode engine's listener here too) every request is a
        # user's: none can hide from the users' families by claiming a leg's role
        factory = self._factory(Position.ENTRY, self.timeline, not settings.pd_decode_upstream)
        sessions = None
        if settings.instrument:  # WebSocket sessions: their metrics, and spans with tracing
            traced = SessionTracing(self.tracing) if self.tracing is not None else None
            sessions = SessionExport(self.session_metrics, traced)
        self._pool = engine_pool(settings, self._upstream, tls.engine())
        if self._pool is None:  # gRPC goes over HTTP/2 whatever the other requests take
            self._grpc_pool = engine_pool(settings, self._upstream, tls.engine(), always=True)
        grpc_pool = self._grpc_pool or self._pool
        self.relay = Relay(settings, self._upstream, factory, sessions, self._pool, grpc_pool)
        self._server = ProxyServer(
            self.relay,
            client_timeout=settings.client_timeout,
            max_body=settings.max_body_bytes,
            on_reject=self._rejected if settings.instrument else None,
            on_handshake=tls.metrics.handshake,
            http2=settings.http2,
        )
        bound = await self._server.listen(host, port, tls.proxy())
        await self._start_pd()
        return bound

    def _factory(
        self, position: Position, timeline: EngineTimeline, claims: bool = True
    ) -> ObserverFactory | None:
        """The observers of one listener (None: ``--no-instrument``); ``claims``: whether a
        body's claim of a leg's role is believed there."""
        settings = self.settings
        if not settings.instrument:
            return None
        ids = random.Random(os.urandom(16)).getrandbits
        on = settings.pd_roles != "off"
        pd = PdSettings(position, on, self.join, lambda: ids(64), claims)
        return observer_factory(
            settings, self.recorder, self.tracing, timeline, self.tenancy, self.provider, pd,
            self.backlogs, self.served,
        )  # fmt: skip

    async def _start_pd(self) -> None:
        """The P/D listeners, each to its engine: the decode engine behind the routing
        sidecar (its requests legs), a prefill engine in this pod (measured as at the port).
        Plain HTTP on ``--pd-host``: the pod's own traffic."""
        settings = self.settings
        for url, port_field, position, name in (
            (settings.pd_decode_upstream, "pd_decode_port", Position.DECODE, "decode"),
            (settings.pd_prefill_upstream, "pd_prefill_port", Position.ENTRY, "prefill"),
        ):
            if not url:
                continue
            upstream = Upstream(
                url.rstrip("/"), settings.connect_timeout, settings.upstream_idle_timeout,
                self.certificates.engine(),
            )  # fmt: skip
            # its own timeline: a stall is judged against the streams of its own engine
            factory = self._factory(position, EngineTimeline())
            leg = dataclasses.replace(settings, upstream=url)
            tls = self.certificates.engine()  # its HTTP/2 pools, as the main listener's
            pool = engine_pool(leg, upstream, tls)
            grpc_pool = pool or engine_pool(leg, upstream, tls, always=True)
            assert grpc_pool is not None  # (always: one)
            self._extra_pools.append(grpc_pool)  # (the one pool, or gRPC's alone)
            relay = Relay(leg, upstream, factory, None, pool, grpc_pool)
            server = ProxyServer(
                relay, client_timeout=settings.client_timeout, max_body=settings.max_body_bytes,
                http2=settings.http2,
            )  # fmt: skip
            self._extra.append((upstream, relay, server))
            port = getattr(settings, port_field)
            with listening(settings.pd_host, port, "pd_host", port_field):
                self.pd_ports[name] = await server.listen(settings.pd_host, port, None)

    def _rejected(self, status: int, duration_s: float) -> None:
        """A request the server refused unparsed still ends in an outcome (``rejected``),
        in a record made and delivered as an observer's is."""
        self.recorder.record(unparsed(status, duration_s), self._failed)

    def _failed(self) -> None:
        """Recording a refused request failed: counted as an observer's failure is, never
        raised (called inside the ``except``)."""
        log.exception("recording a refused request failed")
        self.sink.observer_error()

    def _servers(self) -> list[ProxyServer]:
        main = [] if self._server is None else [self._server]
        return main + [server for _, _, server in self._extra]

    def in_flight(self) -> int:
        """Requests being handled now, on every connection of every listener."""
        return sum(len(c.tasks) for server in self._servers() for c in server.connections)

    def abort_streams(self) -> None:
        """A shutdown's grace is over: every listener's exchanges end now."""
        for relay in [self.relay, *(relay for _, relay, _ in self._extra)]:
            if relay is not None:
                relay.abort_streams()

    async def stop(self, grace: float) -> None:
        """Stop accepting; wait up to ``grace`` seconds for requests in flight (every
        listener's at once); close the pools; write the last traces before the exporter
        shuts down."""
        await asyncio.gather(*(server.shutdown(grace) for server in self._servers()))
        self._server = None
        extra, self._extra = self._extra, []
        for upstream, relay, _ in extra:
            upstream.close()
            relay.flush()
        pools, self._extra_pools = self._extra_pools, []
        for h2_pool in pools:
            h2_pool.close()
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None
        for pool in (self._pool, self._grpc_pool):
            if pool is not None:
                pool.close()
        self._pool = self._grpc_pool = None
        if self.relay is not None:
            self.relay.flush()
        tracing, self.tracing = self.tracing, None
        if tracing is not None:
            await asyncio.to_thread(tracing.close)


class Sidecar:
    """Both applications running on their sockets; ``await start()``, ``await stop()``."""

    def __init__(
        self, settings: Settings, telemetry: Telemetry, nvml: NvmlBackend | None = None
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        # TLS: its files read now (a bad one stops the start, named), kept current once started
        self.certificates = Certificates(settings, TransportMetrics(telemetry.meter, RESULTS))
        engine_tls = self.certificates.engine()
        self.collectors = Collectors(settings, telemetry.meter, nvml, engine_tls=engine_tls)
        self.lifecycle = Lifecycle()
        self.proxy = Proxy(settings, telemetry, [self.collectors], self.certificates)  # MBU/MFU
        if self.collectors.engine is not None:  # its preemption counter: a stall cause
            self.collectors.engine.on_preemptions = self.proxy.timeline.preemptions
            self.collectors.engine.on_engine = self.proxy.provider.engine  # and its name
        self.live: LivePage | None = None
        if settings.ui:
            self.live = LivePage(self.proxy.sink, self.collectors.live_gauges, settings.ui_history)
        self.admin = build_admin_app(
            settings, telemetry, self.collectors, self.lifecycle, self.live, engine_tls
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
            # the admin port first: its collectors' first scrape names the engine, so that the
            # first request is counted under its provider name, not under "unknown"
            with listening(s.metrics_host, s.metrics_port, "metrics_host", "metrics_port"):
                self.metrics_port = await self._serve(self.admin, s.metrics_host, s.metrics_port)
            await self._first_scrape()
            with listening(s.host, s.port):
                self.port = await self.proxy.start(s.host, s.port)
        except ListenError:
            await self.stop()  # what started: the upstream pool, the tracer, a port
            raise
        self.certificates.start()

    async def _first_scrape(self) -> None:
        """Wait, at most ``FIRST_SCRAPE_WAIT`` seconds, for the engine collector's first scrape
        while the provider name is not settled (docs/metrics.md: what happens when it cannot
        be said by then)."""
        engine = self.collectors.engine
        if engine is not None and not self.proxy.provider.settled:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(engine.polled.wait(), FIRST_SCRAPE_WAIT)

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
        tls = self.certificates.admin()
        await web.TCPSite(runner, host, port, reuse_address=True, ssl_context=tls).start()
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
        grace = self.settings.shutdown_grace
        ending = asyncio.get_running_loop().call_later(grace, self.proxy.abort_streams)
        began, busy = time.monotonic(), self.proxy.in_flight()
        log.info("draining: %d requests in flight, up to %g s for them to end", busy, grace)
        try:
            # The proxy first: the admin port stays up meanwhile. Streams the grace ended
            # finish cleanly at once; only a stuck handler waits the extra 5 s to be cancelled.
            await self.proxy.stop(grace + 5)
            log.info("drained in %.1f s: shutting down", time.monotonic() - began)
            for runner in self._runners:
                await runner.cleanup()
            await self.certificates.stop()
        finally:
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
