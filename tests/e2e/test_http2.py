"""HTTP/2 on the proxy port, end to end, with real clients and a real gateway: httpx and the
OpenAI SDK with prior knowledge (h2c) and by ALPN over TLS, curl both ways, nghttpx in front
speaking h2c to the sidecar as a gateway's h2c pool does; every stream measured exactly as a
request over HTTP/1.1 (the same series, token for token); many streams on one connection; the
client's flow-control window honoured."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.export.telemetry import build_telemetry
from tests.support.certs import issue
from tests.support.counted import counted
from tests.support.h2client import SETTINGS, RawH2
from tests.support.ports import free_port
from tests.support.servers import SidecarFactory, SimFactory, eventually

SAME: dict[str, Any] = {
    "prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.01, "seed": 3,
    "output_tokens_min": 12, "output_tokens_max": 12, "max_batch": 64,
}  # fmt: skip
CHAT = "/v1/chat/completions"


def _body(stream: bool = True) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}


async def _streams(http: httpx.AsyncClient, url: str, n: int) -> list[tuple[str, int]]:
    """``n`` streamed chats at once on ``http``: each one's HTTP version and content chunks."""

    async def one() -> tuple[str, int]:
        chunks = 0
        async with http.stream("POST", url + CHAT, json=_body()) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"
                ):
                    chunks += 1
            return resp.http_version, chunks

    return list(await asyncio.gather(*(one() for _ in range(n))))


# what differs between two runs of the same requests: ids, times (floats), the engine's own
# ids, the client's port; what the reads decide (how many ITL samples: two chunks in one read
# are one); and what the times decide (a stall, and so a verdict, on a loaded machine)
VOLATILE = (
    "gen_ai.response.id", "client.port", "server.port", "llmobs.decode.events",
    "llmobs.stall", "llmobs.slo",
)  # fmt: skip


def _spans(exporter: InMemorySpanExporter) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Each span's name and attributes, but what differs run to run, sorted."""
    out = []
    for span in exporter.get_finished_spans():
        attrs = {
            k: str(v) for k, v in (span.attributes or {}).items()
            if not k.startswith(VOLATILE) and not isinstance(v, float)
        }  # fmt: skip
        out.append((span.name, tuple(sorted(attrs.items()))))
    return sorted(out)


async def test_streams_over_h2c_are_measured_as_over_http1(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    spans = {"h2": InMemorySpanExporter(), "h1": InMemorySpanExporter()}
    h2 = await start_sidecar(
        (await start_sim(**SAME)).url, build_telemetry(span_exporter=spans["h2"])
    )
    h1 = await start_sidecar(
        (await start_sim(**SAME)).url, build_telemetry(span_exporter=spans["h1"])
    )
    async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as http:
        over_h2 = await _streams(http, h2.url, 16)  # prior knowledge: one connection
    async with httpx.AsyncClient(timeout=30) as http:
        over_h1 = await _streams(http, h1.url, 16)
    assert over_h2 == [("HTTP/2", 12)] * 16
    assert over_h1 == [("HTTP/1.1", 12)] * 16
    for side in (h1, h2):
        side.sidecar.flush_traces()
    assert counted(h2) == counted(h1)
    assert h2.value("llmobs_requests_total", outcome="ok") == 16
    assert len(spans["h2"].get_finished_spans()) >= 16
    seen = _spans(spans["h2"])
    assert seen == _spans(spans["h1"])
    assert sum(("gen_ai.usage.output_tokens", "12") in attrs for _, attrs in seen) == 16


async def test_the_openai_sdk_over_http2_by_alpn(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    served = issue(trustme.CA(), tmp_path)
    side = await start_sidecar(
        (await start_sim(**SAME)).url, tls_cert_file=str(served.cert),
        tls_key_file=str(served.key),
    )  # fmt: skip
    http = DefaultAsyncHttpxClient(http2=True, verify=served.trusting())
    async with AsyncOpenAI(base_url=side.url + "/v1", api_key="k", max_retries=0,
                           http_client=http) as ai:  # fmt: skip
        raw = await ai.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert raw.http_response.http_version == "HTTP/2"
        chunks = [c async for c in raw.parse()]
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 12
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total", outcome="ok") == 1
    assert side.value("gen_ai_server_time_to_first_token_seconds_count") == 1


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
async def test_curl_with_prior_knowledge_and_by_alpn(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    ca = trustme.CA()
    served = issue(ca, tmp_path)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    sim = await start_sim(**SAME)
    plain = await start_sidecar(sim.url)
    secure = await start_sidecar(
        sim.url, tls_cert_file=str(served.cert), tls_key_file=str(served.key)
    )
    for how, url in (("--http2-prior-knowledge", plain.url), ("--http2", secure.url)):
        curl = await asyncio.create_subprocess_exec(
            "curl", "-sS", how, "--cacert", str(tmp_path / "ca.pem"), "-w", "\n%{http_version}",
            "-H", "content-type: application/json", "-d", json.dumps(_body()), url + CHAT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await curl.communicate()
        assert curl.returncode == 0, err
        text = out.decode()
        assert text.endswith("\n2") and "data: [DONE]" in text, (how, text[-200:])
    for side in (plain, secure):
        side.sidecar.flush_records()
        assert side.value("llmobs_requests_total", outcome="ok") == 1


@pytest.mark.skipif(shutil.which("nghttpx") is None, reason="no nghttpx (Debian: nghttp2-proxy)")
async def test_a_gateway_speaking_h2c_to_the_sidecar(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """nghttpx as a gateway whose pool is declared h2c: clients speak HTTP/1.1 to it, it
    multiplexes them as streams over HTTP/2 with prior knowledge to the sidecar."""
    side = await start_sidecar((await start_sim(**SAME)).url)
    port = int(side.url.rsplit(":", 1)[1])
    front = free_port()
    gateway = await asyncio.create_subprocess_exec(
        "nghttpx", f"--frontend=127.0.0.1,{front};no-tls",
        f"--backend=127.0.0.1,{port};;proto=h2", "--workers=1", "--no-ocsp",
        f"--conf={tmp_path / 'none.conf'}", f"--pid-file={tmp_path / 'pid'}",
        "--errorlog-file=/dev/stderr", "--accesslog-file=/dev/null", "--log-level=WARN",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    (tmp_path / "none.conf").touch()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            async with asyncio.timeout(30):  # nghttpx up, and its backend reached
                while True:
                    try:
                        got = await http.get(f"http://127.0.0.1:{front}/v1/models")
                        if got.status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
            results = await _streams(http, f"http://127.0.0.1:{front}", 8)
        assert results == [("HTTP/1.1", 12)] * 8  # the client's leg; the gateway's is h2c
        side.sidecar.flush_records()
        chats = side.value("llmobs_requests_total", outcome="ok", gen_ai_operation_name="chat")
        assert chats == 8
    finally:
        gateway.terminate()
        await gateway.wait()


async def test_many_streams_on_one_connection_and_a_small_window_honoured(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """100 streams at once on one connection whose client admits 1 KiB per stream and acks
    as it reads: every stream whole, and every byte within the window it opened."""
    side = await start_sidecar((await start_sim(**SAME)).url)
    port = int(side.url.rsplit(":", 1)[1])
    client = await RawH2.connect(port, {SETTINGS.INITIAL_WINDOW_SIZE: 1024})
    body = json.dumps(_body()).encode()
    sids = [client.request(CHAT, body) for _ in range(100)]
    await client.flush()
    await client.until(lambda _: all(client.ended(s) for s in sids))
    for sid in sids:
        assert client.status(sid) == 200
        text = client.body(sid).decode()
        assert text.count('"content":') == 13 and text.endswith("data: [DONE]\n\n")
    largest = max(len(e.data) for e in client.events if hasattr(e, "data") and e.data)
    assert largest <= 1024
    await client.close()
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total", outcome="ok") == 100


async def test_a_stream_over_tls_measured_as_over_h2c(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    served = issue(trustme.CA(), tmp_path)
    secure = await start_sidecar(
        (await start_sim(**SAME)).url, tls_cert_file=str(served.cert),
        tls_key_file=str(served.key),
    )  # fmt: skip
    plain = await start_sidecar((await start_sim(**SAME)).url)
    trust: ssl.SSLContext = served.trusting()
    async with httpx.AsyncClient(http2=True, verify=trust, timeout=30) as http:
        assert await _streams(http, secure.url, 4) == [("HTTP/2", 12)] * 4
    async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as http:
        assert await _streams(http, plain.url, 4) == [("HTTP/2", 12)] * 4
    for side in (secure, plain):
        side.sidecar.flush_records()
    assert counted(secure) == counted(plain)
    await eventually(lambda: secure.value("llmobs_tls_handshakes_total", result="ok") == 1)
