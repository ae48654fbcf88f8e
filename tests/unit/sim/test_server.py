"""The sim's HTTP face (``sim.server``) over loopback: the routes beside the dialects',
the errors it answers, its vLLM-style /metrics, and ``run_sim``."""

from __future__ import annotations

import asyncio
import re
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from llmobs.sim import SimSettings, run_sim
from llmobs.sim.faults import FAULT_HEADER
from tests.support.certs import issue, replace
from tests.support.servers import SimFactory, eventually

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
MESSAGES = [{"role": "user", "content": "Say something."}]


async def stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    """POST a streaming request and read all of it."""
    async with http.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        return await resp.read()


@pytest.mark.parametrize("streamed", [False, True])
async def test_error_rate_answers_500(
    start_sim: SimFactory, http: aiohttp.ClientSession, streamed: bool
) -> None:
    sim = await start_sim(**FAST, error_rate=1.0)
    body = {"messages": MESSAGES, "stream": streamed}
    async with http.post(sim.url + CHAT, json=body) as resp:
        assert resp.status == 500
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert error["type"] == "internal_server_error"
    assert error["code"] == 500
    assert sim.engine.counters.errors == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, b"{not json"),
        (CHAT, b"[1, 2]"),
        (CHAT, b'{"model": "m"}'),
        (CHAT, b'{"messages": []}'),
        (COMPLETIONS, b'{"messages": [{"role": "user", "content": "hi"}]}'),
        (COMPLETIONS, b'{"prompt": "hi", "max_tokens": 0}'),
    ],
)
async def test_bad_requests_answer_400(
    start_sim: SimFactory, http: aiohttp.ClientSession, path: str, body: bytes
) -> None:
    sim = await start_sim(**FAST)
    async with http.post(sim.url + path, data=body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == 400
    assert error["message"]


def metric_values(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for name, labels, value in re.findall(r"^([\w:]+)\{(.*)\} (\S+)$", text, re.MULTILINE):
        assert labels == 'model_name="sim-llama-3-8b"'
        values[name] = float(value)
    return values


async def test_metrics_expose_vllm_gauges(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(
        **{**FAST, "decode_base": 0.01}, max_batch=1, output_tokens_min=30, output_tokens_max=30
    )
    body = {"messages": MESSAGES}
    requests = [asyncio.create_task(stream(http, sim.url + CHAT, body)) for _ in range(2)]
    await eventually(lambda: sim.engine.counters.waiting + sim.engine.counters.running == 2)
    async with http.get(sim.url + "/metrics") as resp:
        assert resp.status == 200
        busy = metric_values(await resp.text())
    await asyncio.gather(*requests)
    async with http.get(sim.url + "/metrics") as resp:
        idle = metric_values(await resp.text())

    assert busy["vllm:num_requests_waiting"] == 1
    assert busy["vllm:num_requests_running"] == 1
    assert 0 < busy["vllm:kv_cache_usage_perc"] <= 1
    assert busy["vllm:request_success_total"] == 0
    assert idle["vllm:num_requests_running"] == idle["vllm:kv_cache_usage_perc"] == 0
    assert idle["vllm:request_success_total"] == 2


async def test_models_health_and_received_headers(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, model="tiny")
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 200
    async with http.get(sim.url + "/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny"]

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = {"Traceparent": traceparent}
    async with http.post(sim.url + CHAT, json={"messages": MESSAGES}, headers=headers) as resp:
        assert (await resp.json())["model"] == "tiny"
    assert sim.engine.counters.last_headers["traceparent"] == traceparent
    assert sim.engine.counters.requests_received == 1


async def test_run_sim_serves_until_cancelled(
    http: aiohttp.ClientSession, capsys: pytest.CaptureFixture[str]
) -> None:
    task = asyncio.create_task(run_sim(SimSettings(port=0, model="cli-model")))
    printed: list[str] = []

    def listening() -> bool:
        printed.append(capsys.readouterr().out)
        return "\n" in "".join(printed)

    await eventually(listening)
    line = "".join(printed).splitlines()[0]
    match = re.fullmatch(r"llmobs sim: listening on (http://\S+) \(model cli-model\)", line)
    assert match is not None
    async with http.get(match.group(1) + "/health") as resp:
        assert resp.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_unknown_fault_header_is_a_400_in_the_dialects_shape(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, fault="header")
    headers = {FAULT_HEADER: "gremlins"}
    async with http.post(sim.url + CHAT, json={"messages": MESSAGES}, headers=headers) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert "unknown X-Sim-Fault 'gremlins'" in error["message"]
    assert sim.engine.counters.errors == 1
    async with http.post(sim.url + CHAT, json={"messages": MESSAGES}) as resp:  # no header
        assert resp.status == 200


async def test_the_models_list_names_each_adapter_with_its_base(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(model="base", lora_adapters=("sql", "chat"))
    async with http.get(sim.url + "/v1/models") as resp:
        data = (await resp.json())["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in data] == [
        ("base", None, "base"), ("sql", "base", "/adapters/sql"),
        ("chat", "base", "/adapters/chat"),
    ]  # fmt: skip


async def test_run_sim_serves_https_and_takes_a_rotated_certificate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ca = trustme.CA()
    pem = issue(ca, tmp_path)
    settings = SimSettings(port=0, tls_cert_file=str(pem.cert), tls_key_file=str(pem.key))
    task = asyncio.create_task(run_sim(settings))
    printed: list[str] = []

    def said(text: str) -> bool:
        printed.append(capsys.readouterr().out)
        return text in "".join(printed)

    await eventually(lambda: said("\n"))
    found = re.search(r"listening on (https://\S+) ", "".join(printed))
    assert found is not None
    url = found.group(1) + "/health"

    async def health(ctx: ssl.SSLContext) -> int:
        async with aiohttp.ClientSession() as http, http.get(url, ssl=ctx) as resp:
            return resp.status

    try:
        assert await health(pem.trusting()) == 200
        new = issue(trustme.CA(), tmp_path, "next")
        replace(pem, new)
        await eventually(lambda: said("certificate reloaded"))
        assert await health(new.trusting()) == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await health(pem.trusting())  # the old CA vouches for nothing served now
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
