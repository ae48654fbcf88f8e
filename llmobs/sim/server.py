"""HTTP face of the sim: every dialect's routes in front of one ``SimEngine``.

Routes: each dialect's POST endpoints (OpenAI chat and completions, Ollama, TGI, Anthropic
Messages, OpenAI Responses; ``SimSettings.dialect`` may keep one), GET /v1/models, /health and
a vLLM-style /metrics. The handler is the same for every dialect (parse, inject a fault,
submit, relay), so the timing, the faults and the cancellation are the engine's whatever the
API; a dialect only renders. Each chunk is written with one ``resp.write`` the moment the
engine emits its tokens, so the timing a client sees is the engine's schedule.

A client that goes away must free its place in the batch at once, as vLLM aborts such a
request: that needs the server runner to be created with ``handler_cancellation=True``
(``run_sim`` does so; tests and embedders must too), so that aiohttp cancels the handler when
the connection drops and the handler can cancel the request in the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from llmobs.sim.config import SimSettings, sim_source
from llmobs.sim.dialects import BadRequest, Context, Endpoint, Exchange, endpoints_for
from llmobs.sim.dialects.base import ChunkReader, Plan
from llmobs.sim.engine import SimEngine
from llmobs.sim.faults import Faulted, Out, fault_of, serve_fault
from llmobs.sim.front import serve_front
from llmobs.sim.pd import PREFILL, KvSource, Leg, engine_id
from llmobs.sim.realtime import PATH as REALTIME_PATH
from llmobs.sim.realtime import realtime_handler
from llmobs.sim.request import EngineStopped, SimRequest
from llmobs.wire.listen import listening
from llmobs.wire.server import ProxyServer
from llmobs.wire.tls import (
    ALPN_H2,
    ALPN_HTTP1,
    ServerFiles,
    ServerTls,
    TlsError,
    Watched,
    following,
    keep_current,
    server_tls,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ENGINE_KEY = web.AppKey("sim_engine", SimEngine)
_REGISTRY_KEY = web.AppKey("sim_registry", CollectorRegistry)


@dataclass
class _Served:
    """Where clients reach the sim when that is not where its application listens (the
    HTTP/2 front's port): what a prefill leg's answer names. None: the connection's own."""

    address: tuple[str, int] | None = None


_SERVED_KEY = web.AppKey("sim_served", _Served)


class _EngineCollector(Collector):
    """Exposes the engine's state under vLLM's metric names, read at scrape time."""

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        engine = self._engine
        counts = engine.counters
        model = [engine.settings.model]
        gauges = (
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", counts.waiting),
            ("vllm:num_requests_running", "Requests in the model execution batch.", counts.running),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100%.", engine.kv_cache_usage()),
            # the sim's own truth (not vLLM's): what the sidecar's prefill backlog estimates
            ("sim:prefill_backlog_seconds", "Seconds of prefill the prompts waiting for their "
             "first token will take (the truth the sidecar's backlog estimates).",
             engine.prefill_backlog(_loop_time())),
        )  # fmt: skip
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(model, value)
            yield gauge
        counters = (
            ("vllm:request_success", "Requests finished successfully.", counts.completed),
            ("vllm:prompt_tokens", "Prefill tokens processed.", counts.prompt_tokens),
            ("vllm:generation_tokens", "Generation tokens processed.", counts.generation_tokens),
            (
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                counts.preemptions,
            ),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens.",
             counts.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens.", counts.prefix_hits),
            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", counts.spec_drafted),
            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
             counts.spec_accepted),
            # the sim's own (not vLLM's): its GPU's busy time, as DCGM's utilisation reads it
            ("sim:busy_seconds", "Seconds the engine spent in steps (its GPU busy).",
             counts.busy_seconds),
        )  # fmt: skip
        for name, doc, count in counters:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(model, count)
            yield counter


def _loop_time() -> float:
    """The engine's clock: the running loop's (a scrape outside one reads the monotonic
    clock, which the default loop's is)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def _json(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="application/json")


def _error(engine: SimEngine, endpoint: Endpoint, message: str, status: int) -> web.Response:
    engine.record_error()
    return _json(endpoint.error(message, status), status)


async def _relay(resp: Out, exchange: Exchange, jobs: list[SimRequest], every: int) -> None:
    """Write head, chunks and tail; the choices of one request take turns, chunk by chunk."""
    if head := exchange.head():
        await resp.write(head)
    readers = [(index, ChunkReader(job, every)) for index, job in enumerate(jobs)]
    while readers:
        live = []
        for index, reader in readers:
            chunk = await reader.read()
            if chunk is not None:
                await resp.write(exchange.chunk(index, chunk, jobs[index]))
                live.append((index, reader))
        readers = live
    if tail := exchange.tail(jobs):
        await resp.write(tail)
    await resp.write_eof()


async def _stream(
    request: web.Request, exchange: Exchange, jobs: list[SimRequest]
) -> web.StreamResponse:
    """Relay tokens as they come: the first at once, then every ``tokens_per_chunk``."""
    engine = request.app[ENGINE_KEY]
    every = 1 if exchange.one_token_per_event else engine.settings.tokens_per_chunk
    headers = {"Content-Type": exchange.media_type}
    if exchange.media_type.startswith("text/event-stream"):
        headers["Cache-Control"] = "no-cache"
    resp = web.StreamResponse(headers=headers)
    await resp.prepare(request)
    try:
        await _relay(resp, exchange, jobs, every)
    except ConnectionResetError:
        # A write noticed the client left before aiohttp cancelled us: the same outcome.
        for job in jobs:
            engine.cancel(job)
    except EngineStopped:
        pass  # shutting down: the stream ends unfinished, as a dying server's would
    return resp


def _handler(endpoint: Endpoint) -> Handler:
    """The route of one endpoint: parse, inject faults, submit, then stream or answer whole."""

    async def handle(request: web.Request) -> web.StreamResponse:
        engine = request.app[ENGINE_KEY]
        seq = engine.receive(request.headers)
        body = await request.read()
        try:
            exchange = endpoint.parse(body, _context(request, engine.settings))
        except BadRequest as exc:
            return _error(engine, endpoint, str(exc), endpoint.bad_request_status)
        if engine.injects_error(seq):
            return _error(engine, endpoint, "simulated engine failure", 500)
        try:
            fault = fault_of(engine.settings.fault, request.headers)
        except ValueError as exc:
            return _error(engine, endpoint, str(exc), 400)
        if fault is not None:
            return await serve_fault(request, fault, _faulted(engine, seq, exchange))
        engine.look_up_prefix(body, exchange.plan.prompt_tokens)
        jobs = _submit(engine, seq, exchange.plan)
        return await _answer(request, endpoint, exchange, jobs)

    return handle


def _context(request: web.Request, settings: SimSettings) -> Context:
    """What a dialect needs of the request and the settings to parse and render it."""
    received = time.monotonic_ns() if settings.stamp else None  # it has the whole request
    source = _kv_source(request, settings) if settings.pd_role == PREFILL else None
    return Context(settings.model, received_ns=received, params=dict(request.match_info),
                   per_request_metrics=settings.per_request_metrics,
                   request_id=request.headers.get("X-Request-Id"), pd_role=settings.pd_role,
                   kv_source=source)  # fmt: skip


def _kv_source(request: web.Request, settings: SimSettings) -> KvSource:
    """This engine as a prefill leg's answer names it: the address the request reached it
    on (the public one behind the HTTP/2 front), and an id stable for the sim."""
    address = request.app[_SERVED_KEY].address
    if address is None:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        address = sockname[:2] if sockname else (settings.host, settings.port)
    host, port = address
    return KvSource(engine_id(settings.seed, port), host, port)


def _submit(engine: SimEngine, seq: int, plan: Plan) -> list[SimRequest]:
    """Put a request in the engine: one sequence per choice, as vLLM fans ``n`` out."""
    decode_leg = plan.leg is Leg.DECODE
    return [
        engine.submit(
            seq,
            plan.prompt_tokens,
            plan.max_tokens,
            plan.seed,
            plan.ignore_eos,
            i,
            plan.eos,
            decode_leg,
        )
        for i in range(plan.n)
    ]


async def _drain(jobs: list[SimRequest]) -> None:
    """Wait for every token of an answer given whole (not streamed)."""
    for job in jobs:
        for _ in range(job.completion_tokens):
            await job.next_token()


async def _answer(
    request: web.Request, endpoint: Endpoint, exchange: Exchange, jobs: list[SimRequest]
) -> web.StreamResponse:
    """Stream the request's tokens as they come, or answer whole once they all have."""
    engine = request.app[ENGINE_KEY]
    try:
        if exchange.stream:
            return await _stream(request, exchange, jobs)
        await _drain(jobs)
    except EngineStopped:
        return _error(engine, endpoint, "engine shutting down", 503)
    except asyncio.CancelledError:
        for job in jobs:
            engine.cancel(job)
        raise
    if exchange.plan.leg is Leg.PREFILL:
        engine.record_prefill_leg()
    return _json(exchange.full(jobs))


def _faulted(engine: SimEngine, seq: int, exchange: Exchange) -> Faulted:
    """The request as ``faults`` sees it: submit it, render its answer, cancel it."""
    every = 1 if exchange.one_token_per_event else engine.settings.tokens_per_chunk

    def submit() -> list[SimRequest]:
        return _submit(engine, seq, exchange.plan)

    async def render(out: Out, jobs: list[SimRequest]) -> None:
        try:
            if exchange.stream:
                await _relay(out, exchange, jobs, every)
                return
            await _drain(jobs)
        except EngineStopped:
            return  # shutting down: the answer ends unfinished, as a dying server's would
        await out.write(exchange.full(jobs).encode())
        await out.write_eof()

    def cancel(jobs: list[SimRequest]) -> None:
        for job in jobs:
            engine.cancel(job)

    media = exchange.media_type if exchange.stream else "application/json"
    return Faulted(media, submit, render, cancel)


async def _models(request: web.Request) -> web.Response:
    """The served models as vLLM lists them: the base model, then each LoRA adapter with
    its base as ``parent``."""
    settings = request.app[ENGINE_KEY].settings
    model = settings.model
    card = {"id": model, "object": "model", "created": 0, "owned_by": "llmobs-sim", "root": model,
            "parent": None}  # fmt: skip
    adapters = [{**card, "id": name, "root": f"/adapters/{name}", "parent": model}
                for name in settings.lora_adapters]  # fmt: skip
    return web.json_response({"object": "list", "data": [card, *adapters]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[_REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _engine_lifecycle(app: web.Application) -> AsyncIterator[None]:
    engine = app[ENGINE_KEY]
    engine.start()
    yield
    await engine.stop()


def build_sim_app(settings: SimSettings) -> web.Application:
    """The sim as an aiohttp application; serve it with ``handler_cancellation=True``."""
    app = web.Application()
    engine = SimEngine(settings)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_EngineCollector(engine))
    app[ENGINE_KEY] = engine
    app[_REGISTRY_KEY] = registry
    app[_SERVED_KEY] = _Served()
    app.cleanup_ctx.append(_engine_lifecycle)
    for endpoint in endpoints_for(settings.dialect):
        app.router.add_post(endpoint.path, _handler(endpoint))
    app.router.add_get(REALTIME_PATH, realtime_handler(ENGINE_KEY))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


async def run_sim(settings: SimSettings) -> None:
    """Serve the sim until cancelled (``llmobs sim``).

    The runner is created with ``handler_cancellation=True`` so that a client disconnect
    cancels its handler and frees the request's place in the batch. With ``http2`` the
    application listens on a loopback port of its own, behind the HTTP/2 front (``front``).
    With ``grpc_port`` the engines' gRPC APIs are served too, on that port, by the same engine
    (``grpc_engine``).
    """
    app = build_sim_app(settings)
    runner = web.AppRunner(app, handler_cancellation=True)
    watched = sim_tls(settings)
    await runner.setup()
    front = None
    grpc_server: Any = None
    try:
        with listening(settings.host, settings.port):
            if settings.http2:
                front, port = await _front(runner, settings, watched)
                app[_SERVED_KEY].address = (settings.host, port)
            else:
                context = following(lambda: watched.current.admin) if watched else None
                site = web.TCPSite(runner, settings.host, settings.port, ssl_context=context)
                await site.start()
                port = runner.addresses[0][1] if runner.addresses else settings.port
        scheme = "https" if watched else "http"
        served = ", HTTP/2 too" if settings.http2 else ""
        print(
            f"llmobs sim: listening on {scheme}://{settings.host}:{port} "
            f"(model {settings.model}{served})",
            flush=True,
        )
        if settings.grpc_port is not None:
            grpc_server, grpc_port = await _grpc(app[ENGINE_KEY], settings)
            print(f"llmobs sim: gRPC on {settings.host}:{grpc_port}", flush=True)
        if watched is None:
            await asyncio.Event().wait()
        else:  # as vLLM's --enable-ssl-refresh: a rotated certificate for new connections
            await keep_current(watched, TLS_CHECK_EVERY, _told)
    finally:
        if grpc_server is not None:
            await grpc_server.stop(GRPC_GRACE)
        if front is not None:
            await front.shutdown(1.0)
        await runner.cleanup()


GRPC_GRACE = 1.0  # seconds the gRPC calls in flight get when the sim stops


async def _grpc(engine: SimEngine, settings: SimSettings) -> tuple[Any, int]:
    """The engines' gRPC APIs on ``--grpc-port``, in front of the HTTP face's engine: imported
    only here (their packages take a fifth of a second to import)."""
    from llmobs.sim.grpc_engine import start_grpc  # noqa: PLC0415 - only when asked for

    port = settings.grpc_port or 0
    with listening(settings.host, port, port_field="grpc_port"):
        return await start_grpc(engine, settings.host, port)


async def _front(
    runner: web.AppRunner, settings: SimSettings, watched: Watched[ServerTls] | None
) -> tuple[ProxyServer, int]:
    """The application on a loopback port, the HTTP/2 front on the sim's (``front``)."""
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    inner = f"http://127.0.0.1:{runner.addresses[0][1]}"
    tls = (lambda: watched.current.proxy) if watched is not None else None
    return await serve_front(inner, settings.host, settings.port, tls)


TLS_CHECK_EVERY = 1.0  # seconds between checks of the certificate's files


def sim_tls(settings: SimSettings) -> Watched[ServerTls] | None:
    """The sim's certificate, kept current (None: plain HTTP); a bad file raises the
    ``TlsError`` that names it (told with the sim's flags by the CLI)."""
    if not settings.tls_cert_file:
        return None
    files = ServerFiles(settings.tls_cert_file, settings.tls_key_file)
    alpn = (ALPN_H2, ALPN_HTTP1) if settings.http2 else (ALPN_HTTP1,)
    return Watched(files.paths(), lambda: server_tls(files, alpn))


def _told(took: bool, error: TlsError | None) -> None:
    if took:
        print("llmobs sim: certificate reloaded", flush=True)
    elif error is not None:
        print(f"llmobs sim: certificate not reloaded: {error.sentence(sim_source)}", flush=True)
