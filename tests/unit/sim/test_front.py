"""The sim's HTTP/2 front (``sim.front``): h2c with prior knowledge and HTTP/1.1 on one port,
each request passed to the sim's application and its response back as it came; the
application gone is a 502."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx

from llmobs.sim import SimSettings, build_sim_app
from llmobs.sim.front import serve_front
from tests.support.ports import free_port
from tests.support.servers import AppFactory

FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


async def test_h2c_and_http1_on_one_port(start_app: AppFactory) -> None:
    inner = await start_app(build_sim_app(dataclasses.replace(SimSettings(), **FAST)))
    front, port = await serve_front(inner, "127.0.0.1", 0, None)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(http1=False, http2=True) as h2:
            whole = await h2.post(url + "/v1/chat/completions", json=BODY)
            async with h2.stream("POST", url + "/v1/chat/completions",
                                 json={**BODY, "stream": True}) as streamed:  # fmt: skip
                lines = [line async for line in streamed.aiter_lines() if line]
        async with httpx.AsyncClient() as h1:
            models = await h1.get(url + "/v1/models")
    finally:
        await front.shutdown(1.0)
    assert (whole.http_version, whole.status_code) == ("HTTP/2", 200)
    assert whole.json()["usage"]["completion_tokens"] == 5
    assert streamed.http_version == "HTTP/2" and lines[-1] == "data: [DONE]"
    assert sum(1 for x in lines[:-1] if json.loads(x[6:])["choices"]) >= 5
    assert (models.http_version, models.status_code) == ("HTTP/1.1", 200)


async def test_the_application_gone_is_a_502() -> None:
    front, port = await serve_front(f"http://127.0.0.1:{free_port()}", "127.0.0.1", 0, None)
    try:
        async with httpx.AsyncClient(http1=False, http2=True) as h2:
            got = await h2.get(f"http://127.0.0.1:{port}/health")
    finally:
        await front.shutdown(1.0)
    assert got.status_code == 502
