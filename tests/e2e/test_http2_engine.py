"""HTTP/2 on the engine leg (``--upstream-http2``), end to end: the sim serving h2c and h2 by
ALPN (``llmobs sim --http2``'s front), and nghttpx as a real HTTP/2 server in front of the sim;
every request a stream and measured exactly as over HTTP/1.1 (the same series, token for
token); a slow client's stream held in the engine while the others flow; a client gone
resetting its stream, which frees the engine's place; an engine that speaks no HTTP/2 a 502."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from llmobs.sim import SimSettings, build_sim_app
from llmobs.sim.front import serve_front
from llmobs.sim.server import ENGINE_KEY
from llmobs.wire.server import ProxyServer
from llmobs.wire.tls import ServerFiles, server_context
from tests.support.certs import issue
from tests.support.counted import counted
from tests.support.ports import free_port
from tests.support.servers import AppFactory, SidecarFactory, SimFactory, eventually

SAME: dict[str, Any] = {
    "prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.01, "seed": 3,
    "output_tokens_min": 12, "output_tokens_max": 12, "max_batch": 64,
}  # fmt: skip
CHAT = "/v1/chat/completions"


@dataclasses.dataclass
class Engine:
    url: str
    sim: Any  # the SimEngine
    front: ProxyServer


@contextlib.asynccontextmanager
async def h2_sim(start_app: AppFactory, tls: Any = None, **overrides: Any) -> AsyncIterator[Engine]:
    """The sim behind its HTTP/2 front (``llmobs sim --http2``)."""
    app = build_sim_app(dataclasses.replace(SimSettings(), **overrides))
    inner = await start_app(app)
    front, port = await serve_front(inner, "127.0.0.1", 0, tls)
    scheme = "https" if tls is not None else "http"
    try:
        yield Engine(f"{scheme}://127.0.0.1:{port}", app[ENGINE_KEY], front)
    finally:
        await front.shutdown(1.0)


async def _streams(url: str, n: int, tokens: int = 12) -> list[int]:
    """``n`` streamed chats at once over HTTP/1.1: each one's content chunks."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": tokens}  # fmt: skip

    async def one(http: httpx.AsyncClient) -> int:
        chunks = 0
        async with http.stream("POST", url + CHAT, json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"
                ):
                    chunks += 1
        return chunks

    async with httpx.AsyncClient(timeout=30) as http:
        return list(await asyncio.gather(*(one(http) for _ in range(n))))


async def test_requests_over_h2c_to_the_engine_are_measured_as_over_http1(
    start_app: AppFactory, start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    async with h2_sim(start_app, **SAME) as engine:
        h2 = await start_sidecar(engine.url, upstream_http2=True)
        h1 = await start_sidecar((await start_sim(**SAME)).url)
        assert await _streams(h2.url, 16) == [12] * 16
        assert await _streams(h1.url, 16) == [12] * 16
        # the front saw one HTTP/2 connection from the sidecar, not 16 of HTTP/1.1
        kinds = {type(c).__name__ for c in engine.front.connections}
    assert kinds == {"H2ServerConnection"}
    for side in (h1, h2):
        side.sidecar.flush_records()
    assert counted(h2) == counted(h1)
    assert h2.value("llmobs_requests_total", outcome="ok") == 16


async def test_h2_by_alpn_to_an_https_engine(
    start_app: AppFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    ca = trustme.CA()
    served = issue(ca, tmp_path)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    context = server_context(ServerFiles(str(served.cert), str(served.key)), ("h2", "http/1.1"))
    async with h2_sim(start_app, lambda: context, **SAME) as engine:
        side = await start_sidecar(
            engine.url, upstream_http2=True, upstream_ca_file=str(tmp_path / "ca.pem")
        )
        assert await _streams(side.url, 4) == [12] * 4
        kinds = {type(c).__name__ for c in engine.front.connections}
    assert kinds == {"H2ServerConnection"}
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total", outcome="ok") == 4


async def test_a_client_gone_resets_its_stream_and_frees_the_engine(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    async with h2_sim(start_app, prefill_base=0.001, prefill_per_token=0.0,
                      decode_base=0.05) as engine:  # fmt: skip
        side = await start_sidecar(engine.url, upstream_http2=True)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "max_tokens": 400}  # fmt: skip
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream("POST", side.url + CHAT, json=body) as resp,
        ):
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    break  # the first token: then the client leaves
        await eventually(lambda: engine.sim.counters.cancelled == 1)
        # the connection to the engine stays, and serves the next request
        assert await _streams(side.url, 2, tokens=3) == [3, 3]
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1


async def test_a_slow_client_holds_its_own_stream_only(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    """A client that stops reading a long response: its stream's window closes in the engine,
    and the other requests on the same connection go on meanwhile."""
    async with h2_sim(start_app, prefill_base=0.001, prefill_per_token=0.0, decode_base=0.0,
                      max_batch=64) as engine:  # fmt: skip
        side = await start_sidecar(engine.url, upstream_http2=True, client_timeout=30.0)
        port = int(side.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": "m", "prompt": "x" * 20, "stream": True,
                           "max_tokens": 200_000, "ignore_eos": True}).encode()  # fmt: skip
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        await reader.readexactly(1024)  # it began, then is never read again
        await asyncio.sleep(0.5)  # its buffers fill
        assert await _streams(side.url, 8, tokens=5) == [5] * 8
        writer.close()


async def test_an_engine_without_http2_is_a_502(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    side = await start_sidecar((await start_sim(**SAME)).url, upstream_http2=True)
    async with httpx.AsyncClient(timeout=30) as http:
        got = await http.post(side.url + CHAT, json={"model": "m", "messages": []})
    assert got.status_code == 502
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total", outcome="upstream_error") == 1


@pytest.mark.skipif(shutil.which("nghttpx") is None, reason="no nghttpx (Debian: nghttp2-proxy)")
async def test_nghttpx_as_the_engines_http2_server(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A real HTTP/2 server on the engine's side: nghttpx takes the sidecar's h2c streams and
    passes them to the sim."""
    sim = await start_sim(**SAME)
    front = free_port()
    (tmp_path / "none.conf").touch()
    server = await asyncio.create_subprocess_exec(
        "nghttpx", f"--frontend=127.0.0.1,{front};no-tls",
        f"--backend=127.0.0.1,{int(sim.url.rsplit(':', 1)[1])}", "--workers=1", "--no-ocsp",
        f"--conf={tmp_path / 'none.conf'}", f"--pid-file={tmp_path / 'pid'}",
        "--errorlog-file=/dev/stderr", "--accesslog-file=/dev/null", "--log-level=WARN",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        side = await start_sidecar(f"http://127.0.0.1:{front}", upstream_http2=True)
        async with asyncio.timeout(30):  # nghttpx up
            while True:
                with contextlib.suppress(OSError):
                    _, w = await asyncio.open_connection("127.0.0.1", front)
                    w.close()
                    break
                await asyncio.sleep(0.1)
        assert await _streams(side.url, 8) == [12] * 8
        side.sidecar.flush_records()
        assert side.value("llmobs_requests_total", outcome="ok") == 8
        assert side.value("gen_ai_server_time_to_first_token_seconds_count") == 8
    finally:
        server.terminate()
        await server.wait()


async def test_an_https_engine_that_refuses_h2_by_alpn_is_a_502_and_said(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    ca = trustme.CA()
    served = issue(ca, tmp_path)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    context = server_context(ServerFiles(str(served.cert), str(served.key)), ("http/1.1",))
    sim = await start_sim(tls=context, **SAME)
    side = await start_sidecar(
        sim.url, upstream_http2=True, upstream_ca_file=str(tmp_path / "ca.pem")
    )
    async with httpx.AsyncClient(timeout=30) as http:
        got = await http.post(side.url + CHAT, json={"model": "m", "messages": []})
    assert got.status_code == 502
    assert "did not agree to HTTP/2 by ALPN (it chose nothing)" in caplog.text
