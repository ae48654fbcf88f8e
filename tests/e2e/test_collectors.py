"""A sidecar in front of the simulated engine, with a fake GPU: GPU gauges, the engine's own
queue and an MBU value, scraped from the admin port like Prometheus would."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmobs import __version__
from llmobs.app import Sidecar
from llmobs.config.settings import Settings
from llmobs.export.metrics.catalogue import (
    COLLECTOR_METRICS,
    ENGINE_PREFIX_RATIO,
    PROCESS_METRICS,
    Kind,
)
from llmobs.export.telemetry import build_telemetry
from tests.support.fake_nvml import GIB, FakeGpu, FakeNvml
from tests.support.servers import SidecarFactory, SimFactory

H100_PEAK = 2619e6 * 5120 / 8 * 2
MODEL_SHAPE: dict[str, Any] = {
    "model_params": 8e9, "weight_dtype": "bf16", "model_layers": 32, "model_kv_heads": 8,
    "model_head_dim": 128, "gpu_peak_flops": 989e12,
}  # fmt: skip


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        assert r.status == 200
        return await r.text()


def values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


async def stream(session: aiohttp.ClientSession, url: str) -> None:
    body = {
        "model": "sim", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello " * 200}],
    }  # fmt: skip
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        await r.read()


async def test_gpu_engine_and_mbu_on_the_admin_port(start_sim: SimFactory) -> None:
    sim = await start_sim(max_batch=4, prefill_base=0.02, decode_base=0.01, decode_per_seq=0.0,
                          output_tokens_min=30, output_tokens_max=30,
                          lora_adapters=("sql-lora",))  # fmt: skip
    settings = Settings(
        upstream=sim.url, host="127.0.0.1", port=0, metrics_host="127.0.0.1", metrics_port=0,
        gpu_sample_interval=0.02, engine_scrape_interval=0.02, **MODEL_SHAPE,
    )  # fmt: skip
    nvml = FakeNvml([FakeGpu("GPU-e2e", gpm=True, dram_bw_util=47.5)])
    sidecar = Sidecar(settings, build_telemetry(), nvml=nvml)
    await sidecar.start()
    proxy, admin = f"http://127.0.0.1:{sidecar.port}", f"http://127.0.0.1:{sidecar.metrics_port}"
    try:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(stream(session, proxy) for _ in range(4)))
        deadline = asyncio.get_running_loop().time() + 5.0
        while True:
            text = await scrape(admin)
            if all(values(text, n) for n in ("llmobs_mbu", "llmobs_engine_requests_running")) and (
                values(text, "llmobs_gpu_memory_bandwidth_utilization")
            ):
                break
            assert asyncio.get_running_loop().time() < deadline, text
            await asyncio.sleep(0.02)
    finally:
        await sidecar.stop()
    assert nvml.shutdowns == 1 and not nvml.live_samples  # stopped with the admin app

    gpu = {"gpu": "0", "uuid": "GPU-e2e", "name": "NVIDIA H100 80GB HBM3"}
    assert values(text, "llmobs_gpu_memory_used_bytes") == [(gpu, 30 * GIB)]
    assert values(text, "llmobs_gpu_memory_bandwidth_utilization") == [
        ({**gpu, "source": "gpm"}, 0.475)
    ]
    assert values(text, "llmobs_engine_requests_waiting") == [({"engine": "vllm"}, 0.0)]
    assert values(text, "llmobs_collector_up") == [
        ({"collector": "gpu"}, 1.0), ({"collector": "engine"}, 1.0),
    ]  # fmt: skip
    # MBU from the sidecar's own TPOT: 16 GB of bf16 weights per step, plus the KV cache of
    # 1 to 4 sequences in flight (128 KiB per token of prompt + half the 30 output tokens)
    tpot = values(text, "gen_ai_server_time_per_output_token_seconds_sum")[0][1] / 4
    usage = values(text, "gen_ai_client_token_usage_sum")
    prompt = next(v for labels, v in usage if labels["gen_ai_token_type"] == "input") / 4
    kv_one = (prompt + 15) * 131_072
    [(labels, mbu)] = values(text, "llmobs_mbu")
    assert labels == {"gen_ai_request_model": "sim"}
    weights_only = 16e9 / tpot / H100_PEAK
    assert weights_only * (1 + kv_one / 16e9) < mbu < weights_only * (1 + 4 * kv_one / 16e9)
    # MFU of prefill: 2 x 8e9 x prompt tokens / TTFT (no engine prefill time) / 989 TFLOP/s
    ttft = values(text, "gen_ai_server_time_to_first_token_seconds_sum")[0][1]
    [(_, mfu)] = values(text, "llmobs_mfu")
    assert mfu == pytest.approx(2 * 8e9 * 4 * prompt / ttft / 989e12)

    # Every collector metric of the catalogue is exposed, with its labels (but the prefix
    # cache's ratio, SGLang's: the sim speaks vLLM, whose counters give it; the unit tests
    # read it from SGLang's page)
    for metric in COLLECTOR_METRICS:
        if metric is ENGINE_PREFIX_RATIO:
            continue
        pattern = "^" + re.escape(metric.prometheus) + r"(\{[^}]*\})? "
        lines = [m.group(0) for m in re.finditer(pattern, text, re.MULTILINE)]
        assert lines, metric.prometheus
        for label in metric.prometheus_labels:
            assert f'{label}="' in lines[0], (metric.prometheus, label)
        assert metric.kind in (Kind.GAUGE, Kind.COUNTER)


async def test_the_engine_is_scraped_at_start(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """With the default 5 s interval, a sidecar just started shows its engine well before
    an interval has passed: the first scrape is at start, not an interval later (the wait
    leaves a loaded machine room, and still ends before the interval would)."""
    sim = await start_sim()
    side = await start_sidecar(sim.url, engine_scrape_interval=5.0, gpu_sample_interval=0)
    deadline = asyncio.get_running_loop().time() + 3.0
    up = [({"collector": "engine"}, 1.0)]
    while values(await scrape(side.metrics_url), "llmobs_collector_up") != up:
        assert asyncio.get_running_loop().time() < deadline, "engine not scraped at start"
        await asyncio.sleep(0.02)


async def test_the_sidecar_shows_its_own_cost_and_build(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """process_* (on Linux), python_info, python_gc_* and llmobs_build_info, with the event
    loop the sidecar runs on; every one of them named in the catalogue."""
    sim = await start_sim()
    side = await start_sidecar(sim.url, engine_scrape_interval=0, gpu_sample_interval=0)
    text = await scrape(side.metrics_url)
    for metric in PROCESS_METRICS:
        assert values(text, metric.prometheus), metric.prometheus
    assert values(text, "process_resident_memory_bytes")[0][1] > 10 << 20
    assert values(text, "process_open_fds")[0][1] >= 3
    [(labels, one)] = values(text, "llmobs_build_info")
    loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    assert one == 1 and labels["event_loop"] == loop and labels["version"] == __version__
    assert labels["json"] in ("orjson", "json")
