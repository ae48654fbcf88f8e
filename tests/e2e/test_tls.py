"""TLS on both legs, end to end: the OpenAI SDK over HTTPS to the sidecar, the sidecar over HTTPS
to the simulated engine (its own CA), measured exactly as over plain HTTP; mTLS; the metrics
port over TLS; a certificate rotated in the middle of 128 streams with none dropped; a rotation
to garbage that keeps the old certificate; the engine's certificate refused or, when told,
not checked."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import trustme
from aiohttp import web
from cryptography import x509
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from tests.support.certs import ca_file, client_context, issue, replace
from tests.support.counted import counted
from tests.support.servers import AppFactory, SidecarFactory, SimFactory, eventually

FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
MESSAGES = [{"role": "user", "content": "Say something."}]
SAME = {"output_tokens_min": 12, "output_tokens_max": 12, "seed": 7}


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


async def _chat(base: str, ctx: ssl.SSLContext | bool, n: int = 4) -> list[int]:
    """``n`` streamed chats through the OpenAI SDK (its own httpx client, trusting ``ctx``):
    the content chunks of each."""
    counts = []
    http = DefaultAsyncHttpxClient(verify=ctx)
    async with AsyncOpenAI(
        base_url=base + "/v1", api_key="k", max_retries=0, http_client=http
    ) as ai:
        for _ in range(n):
            stream = await ai.chat.completions.create(
                model="sim-llama-3-8b",
                messages=[{"role": "user", "content": "Say something."}],
                stream=True,
            )
            chunks = [c async for c in stream]
            counts.append(sum(1 for c in chunks if c.choices and c.choices[0].delta.content))
    return counts


async def test_both_legs_over_tls_are_measured_as_plain_http(
    start_sim: SimFactory, start_sidecar: SidecarFactory, ca: trustme.CA, tmp_path: Path
) -> None:
    engine_ca = trustme.CA()
    engine = issue(engine_ca, tmp_path, "engine")
    served = issue(ca, tmp_path, "sidecar")
    sim_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sim_tls.load_cert_chain(engine.cert, engine.key)
    secure_sim = await start_sim(sim_tls, **FAST, **SAME)
    assert secure_sim.url.startswith("https://")
    secure = await start_sidecar(
        secure_sim.url, tls_cert_file=str(served.cert), tls_key_file=str(served.key),
        upstream_ca_file=str(ca_file(engine_ca, tmp_path / "engine-ca.pem")),
    )  # fmt: skip
    assert secure.url.startswith("https://")
    plain = await start_sidecar((await start_sim(**FAST, **SAME)).url)

    assert await _chat(secure.url, served.trusting()) == await _chat(plain.url, False)
    for side in (secure, plain):
        side.sidecar.flush_records()
    assert counted(secure) == counted(plain)
    assert secure.value("llmobs_requests_total", outcome="ok") == 4
    assert secure.value("llmobs_tls_handshakes_total", result="ok") == 1  # one connection
    expiry = secure.value("llmobs_tls_certificate_expiration_timestamp_seconds")
    assert (
        expiry
        == x509.load_pem_x509_certificate(served.cert.read_bytes()).not_valid_after_utc.timestamp()
    )


async def test_mtls_refuses_a_client_without_a_certificate(
    start_sim: SimFactory, start_sidecar: SidecarFactory, ca: trustme.CA, tmp_path: Path
) -> None:
    served = issue(ca, tmp_path)
    side = await start_sidecar(
        (await start_sim(**FAST)).url, tls_cert_file=str(served.cert),
        tls_key_file=str(served.key), tls_client_ca_file=str(ca_file(ca, tmp_path / "ca.pem")),
    )  # fmt: skip
    with pytest.raises(httpx.HTTPError):
        async with httpx.AsyncClient(verify=served.trusting()) as http:
            await http.get(side.url + "/v1/models")
    shown = client_context(issue(ca, tmp_path, "client", "client"), ca)
    async with httpx.AsyncClient(verify=shown) as http:
        assert (await http.get(side.url + "/v1/models")).status_code == 200
    await eventually(lambda: side.value("llmobs_tls_handshakes_total", result="ok") == 1)
    assert side.value("llmobs_tls_handshakes_total", result="no_certificate") == 1
    assert side.value("llmobs_tls_handshakes_total") == 2


async def test_the_metrics_port_takes_the_same_certificate(
    start_sim: SimFactory, start_sidecar: SidecarFactory, ca: trustme.CA, tmp_path: Path
) -> None:
    served = issue(ca, tmp_path)
    side = await start_sidecar(
        (await start_sim(**FAST)).url, tls_cert_file=str(served.cert),
        tls_key_file=str(served.key), metrics_tls=True,
    )  # fmt: skip
    assert side.metrics_url.startswith("https://")
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz", "/metrics"):
            async with http.get(side.metrics_url + path, ssl=served.trusting()) as resp:
                assert resp.status == 200, path
                if path == "/metrics":
                    assert "llmobs_tls_handshakes_total" in await resp.text()


def _content(line: str) -> str:
    """The text an OpenAI stream's ``data:`` line carries (none: the role's, the last)."""
    choices = json.loads(line.removeprefix("data: ")).get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or "")


async def test_a_rotation_in_the_middle_of_128_streams_drops_none(
    start_sim: SimFactory, start_sidecar: SidecarFactory, ca: trustme.CA, tmp_path: Path
) -> None:
    served = issue(ca, tmp_path)
    tokens = 200
    sim = await start_sim(
        prefill_base=0.001, prefill_per_token=0.0, decode_base=0.04, max_batch=256,
        output_tokens_min=tokens, output_tokens_max=tokens,
    )  # fmt: skip
    side = await start_sidecar(
        sim.url, tls_cert_file=str(served.cert), tls_key_file=str(served.key)
    )
    old_trust = served.trusting()
    first_tokens = asyncio.Event()
    started = 0

    async def one(http: httpx.AsyncClient) -> tuple[int, bool]:
        nonlocal started
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        chunks, done = 0, False
        async with http.stream("POST", side.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: ") and _content(line):
                    chunks += 1
                    if chunks == 1:
                        started += 1
                        if started == 128:
                            first_tokens.set()
        return chunks, done

    limits = httpx.Limits(max_connections=128)
    async with httpx.AsyncClient(verify=old_trust, limits=limits, timeout=60) as http:
        streams = [asyncio.create_task(one(http)) for _ in range(128)]
        async with asyncio.timeout(30):
            await first_tokens.wait()
        successor = trustme.CA()
        new = issue(successor, tmp_path, "next")
        replace(served, new)
        await eventually(
            lambda: side.value("llmobs_tls_certificate_reloads_total", result="ok") == 1,
            within=15,
        )
        assert not any(s.done() for s in streams)  # the rotation came in the middle
        async with httpx.AsyncClient(verify=new.trusting()) as fresh:
            assert (await fresh.get(side.url + "/v1/models")).status_code == 200
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(verify=served.trusting()) as stale:
                await stale.get(side.url + "/v1/models")
        results = await asyncio.gather(*streams)
    assert results == [(tokens, True)] * 128
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total", outcome="ok") == 129


async def test_a_rotation_to_garbage_keeps_the_old_certificate(
    start_sim: SimFactory,
    start_sidecar: SidecarFactory,
    ca: trustme.CA,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = issue(ca, tmp_path)
    side = await start_sidecar(
        (await start_sim(**FAST)).url, tls_cert_file=str(served.cert), tls_key_file=str(served.key)
    )
    served.cert.write_text("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    with caplog.at_level(logging.ERROR, logger="llmobs"):
        await eventually(
            lambda: side.value("llmobs_tls_certificate_reloads_total", result="error") == 1,
            within=15,
        )
    said = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
    assert said == [
        f"serving certificate not reloaded: --tls-cert-file / LLMOBS_TLS_CERT_FILE: "
        f"{served.cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    ]
    async with httpx.AsyncClient(verify=served.trusting()) as http:  # the old one, still
        assert (await http.get(side.url + "/v1/models")).status_code == 200


async def test_the_engines_certificate_is_checked_unless_told_not_to(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    pod = issue(trustme.CA(), tmp_path, "pod")  # a pod's own, signed by no CA we know
    sim_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sim_tls.load_cert_chain(pod.cert, pod.key)
    sim = await start_sim(sim_tls, **FAST)
    checked = await start_sidecar(sim.url)
    async with httpx.AsyncClient() as http:
        resp = await http.get(checked.url + "/v1/models")
    assert resp.status_code == 502
    assert "TLS certificate not accepted" in resp.text
    with caplog.at_level(logging.WARNING, logger="llmobs"):
        trusting = await start_sidecar(sim.url, upstream_insecure_skip_verify=True)
    assert any("NOT checked" in r.getMessage() for r in caplog.records)
    async with httpx.AsyncClient() as http:
        assert (await http.get(trusting.url + "/v1/models")).status_code == 200


async def test_readiness_and_the_engines_metrics_over_https(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """The engine's certificate names its Service, not 127.0.0.1: with that name given, the
    readiness probe's question and the engine collector's scrapes pass its check too."""
    engine_ca = trustme.CA()
    engine = issue(engine_ca, tmp_path, "engine", "llmobs")  # the Service's name only
    sim_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sim_tls.load_cert_chain(engine.cert, engine.key)
    sim = await start_sim(sim_tls, **FAST)
    side = await start_sidecar(
        sim.url, upstream_ca_file=str(ca_file(engine_ca, tmp_path / "ca.pem")),
        upstream_server_name="llmobs", engine_scrape_interval=0.2,
    )  # fmt: skip
    async with httpx.AsyncClient() as http:
        ready = await http.get(side.metrics_url + "/readyz")
        assert (ready.status_code, ready.json()["status"]) == (200, "ready")
        await eventually(lambda: side.value("llmobs_collector_up", collector="engine") == 1)
        assert (await http.get(side.url + "/v1/models")).status_code == 200


async def test_the_engine_is_told_the_client_came_over_https(
    start_app: AppFactory, start_sidecar: SidecarFactory, ca: trustme.CA, tmp_path: Path
) -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"proto": request.headers.get("X-Forwarded-Proto")})

    app = web.Application()
    app.router.add_get("/headers", echo)
    served = issue(ca, tmp_path)
    upstream = await start_app(app)
    secure = await start_sidecar(
        upstream, tls_cert_file=str(served.cert), tls_key_file=str(served.key)
    )
    plain = await start_sidecar(upstream)
    async with httpx.AsyncClient(verify=served.trusting()) as http:
        assert (await http.get(secure.url + "/headers")).json() == {"proto": "https"}
        assert (await http.get(plain.url + "/headers")).json() == {"proto": "http"}
