"""A stand-in for llm-d's P/D routing sidecar, written from its documented behaviour (its
README and vLLM's toy proxy, ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``):

- ``GET /health`` is answered by the router itself;
- a request without ``x-prefiller-host-port`` (nor the older ``x-prefiller-url``) goes to the
  local decoder as it came;
- one with it is sent first to that prefill pod as a prefill leg: the same body with
  ``kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_*: null}``,
  ``stream: false``, ``max_tokens: 1`` (and ``max_completion_tokens: 1`` when the body has
  it), no ``stream_options``; the user's headers cloned, and an ``x-request-id`` it makes;
- an error answer of the prefill leg goes back to the client as it came;
- then the decode leg: the user's body plus the ``kv_transfer_params`` the prefill answered,
  to the local decoder with the same headers and ``x-request-id``; its answer is streamed back
  to the client unchanged.

What it did is kept per request (``legs``), the truth the tests compare with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from llmobs.export.telemetry import Telemetry
from tests.support.servers import AppFactory, SidecarFactory, SidecarHandle, SimFactory

_NOT_CLONED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
PREFILL_PARAMS = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}  # fmt: skip


@dataclass
class LegLog:
    """One disaggregated request as the router handled it (monotonic ns)."""

    request_id: str
    prefill_status: int = 0
    prefill_answer: dict[str, Any] = field(default_factory=dict)
    prefill_sent_ns: int = 0
    prefill_back_ns: int = 0
    decode_sent_ns: int = 0


class PdRouter:
    """The routing sidecar: ``app`` serves it; ``decoder`` is the local decode engine's base
    URL (settable after start: a test learns the sidecar's decode port later)."""

    def __init__(self, decoder: str = "") -> None:
        self.decoder = decoder
        self.legs: list[LegLog] = []
        self.passed = 0  # requests handed to the decoder whole
        self._session: aiohttp.ClientSession | None = None
        self.app = web.Application()
        self.app.router.add_get("/health", self._health)  # answered itself, as llm-d's is
        self.app.router.add_route("*", "/{tail:.*}", self._handle)
        self.app.on_cleanup.append(self._close)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=120)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self._session

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_CLONED}
        prefiller = request.headers.get("x-prefiller-host-port") or request.headers.get(
            "x-prefiller-url", ""
        )
        if not prefiller or request.method != "POST":
            self.passed += 1
            return await self._stream(request, self.decoder, raw, headers)
        body = json.loads(raw)
        log = LegLog(str(uuid.uuid4()))
        headers["x-request-id"] = log.request_id
        base = prefiller if "://" in prefiller else f"http://{prefiller}"
        leg = dict(body, kv_transfer_params=dict(PREFILL_PARAMS), stream=False, max_tokens=1)
        if "max_completion_tokens" in leg:
            leg["max_completion_tokens"] = 1
        leg.pop("stream_options", None)
        log.prefill_sent_ns = time.perf_counter_ns()
        async with self._client().post(base + request.path_qs, json=leg, headers=headers) as r:
            answer = await r.read()
            log.prefill_back_ns = time.perf_counter_ns()
            log.prefill_status = r.status
            if r.status != 200:
                self.legs.append(log)
                return web.Response(body=answer, status=r.status, content_type=r.content_type)
        log.prefill_answer = json.loads(answer)
        body["kv_transfer_params"] = log.prefill_answer.get("kv_transfer_params")
        self.legs.append(log)
        log.decode_sent_ns = time.perf_counter_ns()
        return await self._stream(request, self.decoder, json.dumps(body).encode(), headers)

    async def _stream(
        self, request: web.Request, base: str, body: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        """``body`` to ``base``, its answer streamed back as it comes."""
        async with self._client().request(
            request.method, base + request.path_qs, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


# a prefill pod and a decode pod as the sim plays them, each reporting its schedule (vLLM's
# per-request metrics): prompts of 100-8,000 tokens take 6-85 ms to prefill and 2-42 ms to
# transfer; the decode pod batches up to 8
PREFILL: dict[str, Any] = {
    "pd_role": "prefill", "per_request_metrics": True, "max_batch": 2, "prefill_base": 0.005,
    "prefill_per_token": 0.00001, "decode_base": 0.005, "decode_per_seq": 0.0,
}  # fmt: skip
DECODE: dict[str, Any] = {
    "pd_role": "decode", "per_request_metrics": True, "max_batch": 8, "prefill_base": 0.004,
    "prefill_per_token": 0.0, "decode_base": 0.008, "decode_per_seq": 0.0005,
    "output_tokens_min": 4, "output_tokens_max": 12, "kv_transfer_base": 0.002,
    "kv_transfer_per_token": 0.000005,
}  # fmt: skip


@dataclass
class Pair:
    """A P/D pair behind one sidecar in the placement that sees every part: the pod's entry
    before the router, the decode engine's listener behind it, the prefill engine's."""

    side: SidecarHandle
    router: PdRouter
    prefiller: str  # what the scheduler would put in x-prefiller-host-port


async def start_pair(
    start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory,
    prefill: dict[str, Any] | None = None, telemetry: Telemetry | None = None, **sidecar: Any,
) -> Pair:  # fmt: skip
    prefiller = await start_sim(**PREFILL, **(prefill or {}))
    decode = await start_sim(**DECODE)
    router = PdRouter()
    router_url = await start_app(router.app)
    side = await start_sidecar(
        router_url, telemetry=telemetry, pd_decode_upstream=decode.url, pd_decode_port=0,
        pd_prefill_upstream=prefiller.url, pd_prefill_port=0, **sidecar,
    )  # fmt: skip
    ports = side.sidecar.proxy.pd_ports
    router.decoder = f"http://127.0.0.1:{ports['decode']}"
    return Pair(side, router, f"127.0.0.1:{ports['prefill']}")


def prompt(tokens: int) -> str:
    return "abc " * tokens  # the sim counts four characters a token


@contextlib.asynccontextmanager
async def pd_load(pair: Pair, concurrency: int = 2) -> AsyncIterator[None]:
    """Users' requests with a remote prefill, ``concurrency`` at a time, until the block ends."""

    async def user(seed: int) -> None:
        rng = random.Random(seed)
        headers = {"x-prefiller-host-port": pair.prefiller}
        async with aiohttp.ClientSession() as s:
            while True:
                body = {"model": "m", "stream": True, "messages": [
                    {"role": "user", "content": prompt(rng.randint(100, 2000))}]}  # fmt: skip
                url = pair.side.url + "/v1/chat/completions"
                async with s.post(url, json=body, headers=headers) as r:
                    await r.read()

    tasks = [asyncio.create_task(user(i)) for i in range(concurrency)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
