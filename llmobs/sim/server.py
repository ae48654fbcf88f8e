"""HTTP face of the sim: an OpenAI-compatible server in front of ``SimEngine``.

Routes: POST /v1/chat/completions and /v1/completions (streamed or not), GET /v1/models,
/health and a vLLM-style /metrics. Each SSE chunk is written with one ``resp.write`` the
moment the engine emits its tokens, so the timing a client sees is the engine's schedule.

A client that goes away must free its place in the batch at once, as vLLM aborts such a
request: that needs the server runner to be created with ``handler_cancellation=True``
(``run_sim`` does so; tests and embedders must too), so that aiohttp cancels the handler when
the connection drops and the handler can cancel the request in the engine.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from llmobs.sim.config import SimSettings
from llmobs.sim.engine import EngineStopped, SimEngine, SimRequest
from llmobs.sim.protocol import (
    DONE,
    BadRequest,
    ChunkRenderer,
    CompletionCall,
    error_body,
    full_response,
    parse_call,
)

ENGINE_KEY = web.AppKey("sim_engine", SimEngine)
_REGISTRY_KEY = web.AppKey("sim_registry", CollectorRegistry)


class _EngineCollector(Collector):
    """Exposes the engine's state under vLLM's metric names, read at scrape time."""

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        engine, stats = self._engine, self._engine.stats
        model = [engine.settings.model]
        gauges = (
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", stats.waiting),
            ("vllm:num_requests_running", "Requests in the model execution batch.", stats.running),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100%.", engine.kv_cache_usage()),
        )
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(model, value)
            yield gauge
        counters = (
            ("vllm:request_success", "Requests finished successfully.", stats.completed),
            ("vllm:prompt_tokens", "Prefill tokens processed.", stats.prompt_tokens),
            ("vllm:generation_tokens", "Generation tokens processed.", stats.generation_tokens),
        )
        for name, doc, count in counters:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(model, count)
            yield counter


def _json(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="application/json")


def _error(engine: SimEngine, message: str, kind: str, status: int) -> web.Response:
    engine.record_error()
    return _json(error_body(message, kind, status), status)


async def _relay(
    resp: web.StreamResponse,
    render: ChunkRenderer,
    job: SimRequest,
    every: int,
    call: CompletionCall,
) -> None:
    total, sent = job.completion_tokens, 0
    pending: list[str] = []
    while sent < total:
        pending.append(await job.next_token())
        count = sent + len(pending)
        if sent == 0 or len(pending) >= every or count == total:
            if sent == 0 and call.chat:
                await resp.write(render.role())
            finish = job.finish_reason if count == total else None
            await resp.write(render.content("".join(pending), finish, count))
            sent = count
            pending.clear()
    if call.include_usage:
        await resp.write(render.usage(total))
    await resp.write(DONE)
    await resp.write_eof()


async def _stream(
    request: web.Request, call: CompletionCall, job: SimRequest, completion_id: str, created: int
) -> web.StreamResponse:
    """Relay tokens as SSE: the first at once, then every ``tokens_per_chunk`` (vLLM-style)."""
    every = request.app[ENGINE_KEY].settings.tokens_per_chunk
    render = ChunkRenderer(call, completion_id, created)
    resp = web.StreamResponse(headers={"Cache-Control": "no-cache"})
    resp.content_type = "text/event-stream"
    resp.charset = "utf-8"
    await resp.prepare(request)
    try:
        await _relay(resp, render, job, every, call)
    except ConnectionResetError:
        # A write noticed the client left before aiohttp cancelled us: the same outcome.
        request.app[ENGINE_KEY].cancel(job)
    except EngineStopped:
        pass  # shutting down: the stream ends without [DONE], as a dying server's would
    return resp


async def _complete(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    seq = engine.receive(request.headers)
    try:
        call = parse_call(await request.read(), chat, engine.settings.model)
    except BadRequest as exc:
        return _error(engine, str(exc), "invalid_request_error", 400)
    if engine.injects_error(seq):
        return _error(engine, "simulated engine failure", "internal_server_error", 500)
    job = engine.submit(seq, call.prompt_tokens, call.max_tokens, call.seed, call.ignore_eos)
    completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(16)}"
    created = int(time.time())
    try:
        if call.stream:
            return await _stream(request, call, job, completion_id, created)
        text = "".join([await job.next_token() for _ in range(job.completion_tokens)])
    except EngineStopped:
        return _error(engine, "engine shutting down", "service_unavailable", 503)
    except asyncio.CancelledError:
        engine.cancel(job)
        raise
    body = full_response(
        call,
        completion_id=completion_id,
        created=created,
        text=text,
        finish_reason=job.finish_reason,
        completion_tokens=job.completion_tokens,
    )
    return _json(body)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, chat=True)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, chat=False)


async def _models(request: web.Request) -> web.Response:
    model = request.app[ENGINE_KEY].settings.model
    card = {"id": model, "object": "model", "created": 0, "owned_by": "llmobs-sim", "root": model}
    return web.json_response({"object": "list", "data": [card]})


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
    app.cleanup_ctx.append(_engine_lifecycle)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


async def run_sim(settings: SimSettings) -> None:
    """Serve the sim until cancelled (``llmobs sim``).

    The runner is created with ``handler_cancellation=True`` so that a client disconnect
    cancels its handler and frees the request's place in the batch.
    """
    runner = web.AppRunner(build_sim_app(settings), handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else settings.port
        print(
            f"llmobs sim: listening on http://{settings.host}:{port} (model {settings.model})",
            flush=True,
        )
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
