"""The collectors as the settings assemble them (``collectors.Collectors``): which run and
where the engine's pages are; the live page's gauges from their last readings (absent where
a collector is down or a value unknown); MBU and MFU from the requests it consumes, against
the operator's figures; and its lifecycle, polling from the application's start and closing
every collector at its end. Each collector alone: test_gpu.py, test_engine.py,
test_efficiency.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from llmobs.collectors import Collectors
from llmobs.collectors.nvml import PynvmlBackend
from llmobs.config.settings import Settings
from llmobs.export.live import Gauge
from llmobs.export.metrics.catalogue import MBU, MFU
from llmobs.export.telemetry import Telemetry, build_telemetry
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.fake_nvml import GIB, FakeGpu, FakeNvml
from tests.support.ports import free_port
from tests.support.recording import record_request, recording
from tests.support.scripted import Script, ScriptedUpstream
from tests.support.servers import AppFactory, eventually

LLAMACPP = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n"


def settings(upstream: str = "http://127.0.0.1:9/", **overrides: Any) -> Settings:
    overrides = {"gpu_sample_interval": 0, "engine_scrape_interval": 0, **overrides}
    return Settings(upstream=upstream, host="127.0.0.1", port=0, metrics_host="127.0.0.1",
                    metrics_port=0, **overrides)  # fmt: skip


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    found = build_telemetry(self_metrics=False)
    yield found
    found.shutdown()


async def test_the_settings_say_which_collectors_run(telemetry: Telemetry) -> None:
    none = Collectors(settings(), telemetry.meter)
    assert (none.gpu, none.engine, none.collectors, none.live_gauges()) == (None, None, (), {})
    both = Collectors(
        settings(gpu_sample_interval=0.5, engine_scrape_interval=2.0, gpus=("1",)),
        telemetry.meter,
    )
    assert both.gpu is not None and both.engine is not None
    assert both.collectors == (both.gpu, both.engine)
    assert isinstance(both.gpu.backend, PynvmlBackend)  # the real NVML unless one is given
    assert (both.gpu.interval, both.gpu.selection.entries) == (0.5, ("1",))
    # the engine's pages under the upstream's base, unless its metrics URL is given
    assert both.engine.url == "http://127.0.0.1:9/metrics"
    assert both.engine.models_url == "http://127.0.0.1:9/v1/models"
    assert both.engine.interval == 2.0
    given = Collectors(
        settings(engine_scrape_interval=1.0, engine_metrics_url="http://127.0.0.1:8/m"),
        telemetry.meter,
    )
    assert given.engine is not None and given.engine.url == "http://127.0.0.1:8/m"
    await both.gpu.close()


async def test_the_live_gauges_are_the_last_readings(
    telemetry: Telemetry, start_app: AppFactory
) -> None:
    """The engine's queue, batch and KV cache as it reports them; the GPUs' memory used as a
    share of all their memory, their bandwidth's mean once every GPU has one (GPM: from the
    second sample)."""
    page = (LLAMACPP + "llamacpp:kv_cache_usage_ratio 0.125\n").encode()
    engine = ScriptedUpstream({"default": Script(((0, page),))})
    url = await start_app(engine.app())
    gpus = [FakeGpu("GPU-a", gpm=True, dram_bw_util=45.0),
            FakeGpu("GPU-b", total=40 * GIB, used=20 * GIB, gpm=True, dram_bw_util=25.0),
            FakeGpu("GPU-c", fail={"memory"}, gpm=True, dram_bw_util=35.0)]  # fmt: skip
    on = settings(url, gpu_sample_interval=1.0, engine_scrape_interval=1.0)
    collectors = Collectors(on, telemetry.meter, nvml=FakeNvml(gpus))
    assert collectors.gpu is not None and collectors.engine is not None
    assert collectors.live_gauges() == {}  # nothing read yet
    await collectors.gpu.collect_once()
    await collectors.engine.collect_once()
    memory = (30 + 20) / (80 + 40)  # GPU-c's memory unread: left out of both sums
    assert collectors.live_gauges() == {
        Gauge.ENGINE_WAITING: 1.0, Gauge.ENGINE_RUNNING: 2.0, Gauge.ENGINE_KV_CACHE: 0.125,
        Gauge.GPU_MEMORY_USED: pytest.approx(memory),
    }  # fmt: skip
    await collectors.gpu.collect_once()
    assert collectors.live_gauges()[Gauge.GPU_BANDWIDTH] == pytest.approx(0.35)
    await collectors.gpu.close()
    await collectors.engine.close()


async def test_no_gauge_from_a_collector_down_or_a_value_unknown(
    telemetry: Telemetry, start_app: AppFactory
) -> None:
    engine = ScriptedUpstream({"default": Script(((0, LLAMACPP.encode()),))})  # no KV cache
    url = await start_app(engine.app())
    on = settings(url, gpu_sample_interval=1.0, engine_scrape_interval=1.0)
    nvml = FakeNvml([], init_error="Driver Not Loaded")
    collectors = Collectors(on, telemetry.meter, nvml=nvml)
    assert collectors.gpu is not None and collectors.engine is not None
    await collectors.gpu.collect_once()
    await collectors.engine.collect_once()
    assert collectors.live_gauges() == {Gauge.ENGINE_WAITING: 1.0, Gauge.ENGINE_RUNNING: 2.0}
    collectors.engine.url = f"http://127.0.0.1:{free_port()}/metrics"  # nobody there: down
    await collectors.engine.collect_once()
    assert not collectors.engine.up and collectors.live_gauges() == {}
    await collectors.gpu.close()
    await collectors.engine.close()


def test_each_request_consumed_counts_in_mbu_and_mfu(telemetry: Telemetry) -> None:
    """8e9 parameters of bf16 (16 GB read a step), 2 TB/s and 1 PFLOP/s given: a request of
    11 output tokens 0.02 s apart after 100 prompt tokens in 0.5 s."""
    shape: dict[str, Any] = {"model_params": 8e9, "weight_dtype": "bf16",
                             "gpu_peak_bandwidth": 2e12, "gpu_peak_flops": 1e15}  # fmt: skip
    collectors = Collectors(settings(**shape), telemetry.meter, clock=lambda: 1000.0)
    _, recorder = recording(telemetry.registry, consumers=[collectors])
    stats = RequestStats(
        "chat", "m", Outcome.OK, 200, True, 0.7, 0.5, 0.02, 100, 11, TokenSource.USAGE, 11,
        10, 0.2, 0.004, 0.02, 0, 1.0,
    )  # fmt: skip
    record_request(recorder, stats)
    labels = {"gen_ai_request_model": "m"}
    assert telemetry.registry.get_sample_value(MBU.prometheus, labels) == pytest.approx(0.4)
    assert telemetry.registry.get_sample_value(MFU.prometheus, labels) == pytest.approx(0.0032)


async def test_the_lifecycle_polls_from_the_start_and_closes_at_the_end(
    telemetry: Telemetry,
) -> None:
    nvml = FakeNvml([FakeGpu("GPU-a", gpm=True)])
    collectors = Collectors(settings(gpu_sample_interval=0.01), telemetry.meter, nvml=nvml)
    gpu = collectors.gpu
    assert gpu is not None
    running = collectors.lifecycle(web.Application())
    await anext(running)
    await eventually(lambda: gpu.polls >= 2)  # on its schedule, the loop free between polls
    assert gpu.up and nvml.shutdowns == 0
    with pytest.raises(StopAsyncIteration):  # the application's end
        await anext(running)
    assert nvml.shutdowns == 1 and not nvml.live_samples  # closed: NVML shut, samples freed
    polls = gpu.polls
    await asyncio.sleep(0.05)  # five intervals: polls, had the task outlived the end
    assert gpu.polls == polls
