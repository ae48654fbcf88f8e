"""The live page over HTTP: its data follows what the engine did, its files are cached, and it
is protected like /metrics. (test_ui_browser.py loads it in a real browser.)"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from llmobs.tools.traffic import Call, stream_call
from tests.support.fake_nvml import FakeGpu, FakeNvml
from tests.support.servers import Json, SidecarFactory, SidecarHandle, SimFactory, requests_shown

# One request at a time, a stall every 8 decode steps: requests queue and streams stutter.
ENGINE: dict[str, Any] = {
    "max_batch": 1, "prefill_base": 0.05, "prefill_per_token": 0.0, "decode_base": 0.01,
    "decode_per_seq": 0.0, "output_tokens_min": 24, "output_tokens_max": 24,
    "stall_every": 8, "stall_ms": 150.0,
}  # fmt: skip
CHAT = Call("/v1/chat/completions", {"model": "chat-model", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip


async def load(side: SidecarHandle, clients: int) -> Json:
    """``clients`` streams at once; the live page's data once a tick has counted them all."""
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(stream_call(session, side.url, CHAT) for _ in range(clients))
        )
    assert all(r.ok for r in results), results
    return await side.live(lambda data: requests_shown(data) == clients)


async def get(url: str, **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers,
                                                   allow_redirects=False) as r:  # fmt: skip
        return r.status, CIMultiDict(r.headers), await r.read()


async def test_the_data_shows_the_queue_and_the_stalls(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    # a stall is a gap of 100 ms or more: the engine's pauses are, and so is any a loaded
    # machine makes, which then counts in the bands over 100 ms too
    side = await start_sidecar(sim.url, stall_min_gap=0.1)
    data = await load(side, clients=4)
    model = data["models"]["chat-model"]
    # the engine serves one at a time: the others waited for their first token
    assert max(v for v in data["global"]["queue"] if v is not None) >= 2
    # every 8th decode step paused 150 ms: stalls, and tokens after a gap over 100 ms
    stalls = sum(v for v in model["stalls"] if v)
    assert stalls == side.value("llmobs_stalls_total") > 0
    # each the engine's own pause (one stream at a time, no prefill in the gap), as counted
    assert sum(v for v in model["stalls_engine_pause"] if v) == stalls
    # the waits for the first token, by phase: all outside the sidecar (the sim reports none)
    assert max(v for v in model["ttft_other"] if v is not None) > 0.1
    assert sum(v for v in model["itl_100_250ms"] if v) > 0
    assert sum(v for band in ("itl_100_250ms", "itl_gt_250ms") for v in model[band] if v) >= stalls
    assert sum(v for v in model["tokens"] if v) == 4 * 24
    assert sum(v for v in model["requests"] if v) == 4
    p99 = [v for v in model["ttft_p99"] if v is not None]
    assert p99 and max(p99) > 0.3  # the last request waited for three others
    # one model: "all" is that model (0 where the model had no slot yet, not None)
    assert [v or 0 for v in data["models"]["all"]["tokens"]] == [v or 0 for v in model["tokens"]]
    # since: only the points after it, in order. The ticker goes on meanwhile: a point it
    # added between two requests comes after every point the first one saw
    t = data["t"]
    assert len(t) >= 2 and t == sorted(set(t))
    for since in t:
        status, headers, body = await get(side.metrics_url + f"/ui/data?since={since}")
        assert status == 200 and headers["Cache-Control"] == "no-store"
        later = json.loads(body)["t"]
        seen = t[t.index(since) + 1 :]
        assert later[: len(seen)] == seen, (since, later)
        assert all(a < b for a, b in zip([since, *later], later, strict=False)), (since, later)
    future = json.loads((await get(side.metrics_url + f"/ui/data?since={t[-1] + 3600}"))[2])
    assert future["t"] == [] and future["models"]["chat-model"]["tokens"] == []
    assert (await get(side.metrics_url + "/ui/data?since=x"))[0] == 400


async def test_the_page_and_its_files(start_sim: SimFactory, start_sidecar: SidecarFactory) -> None:
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url)
    status, headers, _ = await get(side.metrics_url + "/")
    assert status == 302 and headers["Location"] == "/ui/"
    status, headers, body = await get(side.metrics_url + "/ui/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert b"static/uplot-1.6.32.min.js" in body and b"http" not in body.split(b"<body>")[0]
    status, headers, body = await get(side.metrics_url + "/ui/static/uplot-1.6.32.min.js")
    assert status == 200 and headers["Cache-Control"] == "public, max-age=86400"
    assert body.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    status, _, _ = await get(side.metrics_url + "/ui/static/uplot-1.6.32.min.js",
                             **{"If-None-Match": headers["ETag"]})  # fmt: skip
    assert status == 304
    # the whole page: under the issue's ~200 KB
    sizes = [
        len((await get(side.metrics_url + "/ui/static/" + name))[2])
        for name in ("uplot-1.6.32.min.js", "uplot-1.6.32.min.css", "page.js", "page.css")
    ]
    assert sum(sizes) + len(body) < 200_000
    for name in ("..%2fapp.py", "index.html", "nothing.js"):
        assert (await get(side.metrics_url + "/ui/static/" + name))[0] == 404


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("path", ["/ui/", "/ui/data", "/ui/static/page.js", "/metrics"])
async def test_the_page_needs_the_metrics_token(
    path: str, start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url, metrics_token="s3cret")
    url = side.metrics_url + path
    status, headers, _ = await get(url)
    assert status == 401
    if path.startswith("/ui"):  # a browser asks its user for the token
        assert headers["WWW-Authenticate"].startswith('Basic realm="llmobs"')
    for wrong in ("Bearer nope", basic("x", "nope"), "Basic !!!", "Basic " + "é"):
        assert (await get(url, Authorization=wrong))[0] == 401, wrong
    assert (await get(url, Authorization="Bearer s3cret"))[0] == 200
    assert (await get(url, Authorization=basic("anyone", "s3cret")))[0] == 200
    assert (await get(side.metrics_url + "/healthz"))[0] == 200


async def test_no_page_when_turned_off(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url, ui=False)
    assert (await get(side.metrics_url + "/ui/"))[0] == 404
    assert side.sidecar.live is None


async def test_the_engine_and_gpu_gauges_when_their_collectors_are_up(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**ENGINE)
    nvml = FakeNvml([FakeGpu("GPU-a", gpm=True, dram_bw_util=47.5)])
    side = await start_sidecar(
        sim.url, nvml=nvml, engine_scrape_interval=0.2, gpu_sample_interval=0.2
    )
    await load(side, clients=2)

    def settled(data: Json) -> bool:  # a point read after both collectors' last readings
        gauges = data["global"]
        return gauges["engine_running"][-1] == 0 and gauges["gpu_bandwidth"][-1] is not None

    data = (await side.live(settled))["global"]
    # the simulated engine's vLLM names, read by the engine collector; the fake GPU's memory
    # (30 of 80 GiB) and bandwidth (47.5 %)
    assert data["engine_running"][-1] == 0 and data["engine_kv_cache"][-1] is not None
    assert data["gpu_memory_used"][-1] == pytest.approx(30 / 80)
    assert data["gpu_bandwidth"][-1] == pytest.approx(0.475)
