"""The GPU collector against a fake NVML: several GPUs, MIG, GPM or not, errors, no GPU."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmobs.collectors.base import register_status
from llmobs.collectors.devices import DeviceSelection
from llmobs.collectors.gpu import (
    GpuCollector,
    GpuReading,
    peak_bandwidth,
    register_gpu,
)
from llmobs.collectors.nvml import NvmlError, PynvmlBackend
from llmobs.export.telemetry import build_telemetry
from tests.support.fake_nvml import GIB, FakeGpu, FakeNvml

H100 = 2619e6 * 5120 / 8 * 2  # 3.352 TB/s


def rig(gpus: list[FakeGpu], selection: DeviceSelection | None = None) -> GpuCollector:
    return GpuCollector(FakeNvml(gpus), selection or DeviceSelection(), interval=0.01)


async def polled(collector: GpuCollector, times: int = 1) -> dict[str, GpuReading]:
    for _ in range(times):
        await collector.collect_once()
    assert collector.snapshot is not None, "collector is down"
    return {g.gpu: g for g in collector.snapshot.gpus}


def test_peak_bandwidth_is_clock_times_bus_width_times_two() -> None:
    assert peak_bandwidth(2619e6, 5120) == pytest.approx(3.352e12, rel=1e-3)  # H100 SXM HBM3
    assert peak_bandwidth(1215e6, 5120) == pytest.approx(1.555e12, rel=1e-3)  # A100 40GB HBM2
    assert peak_bandwidth(10501e6, 384) == pytest.approx(1.008e12, rel=1e-3)  # RTX 4090 GDDR6X


async def test_every_gpu_is_read_with_gpm_where_supported() -> None:
    hopper = FakeGpu("GPU-h100", gpm=True, dram_bw_util=45.0)
    ampere = FakeGpu("GPU-a100", "NVIDIA A100-SXM4-40GB", 40 * GIB, 8 * GIB, None,
                     mem_util=25.0, max_mem_clock_mhz=1215.0)  # fmt: skip
    collector = rig([hopper, ampere])
    first = await polled(collector)
    assert first["0"].bandwidth_utilization is None  # GPM needs two samples
    assert (first["1"].bandwidth_utilization, first["1"].bandwidth_source) == (0.25, "mem_util")
    got = await polled(collector)
    h, a = got["0"], got["1"]
    assert (h.bandwidth_utilization, h.bandwidth_source) == (0.45, "gpm")
    assert h.peak_bandwidth == pytest.approx(H100)
    assert (h.utilization, h.memory_controller, h.power_w, h.temperature_c) == (0.9, 0.6, 500, 61)
    assert (h.sm_clock_hz, h.memory_clock_hz) == (1980e6, 2619e6)
    assert h.memory is not None and (h.memory.used, h.memory.reserved) == (30 * GIB, GIB // 2)
    assert a.memory is not None and (a.memory.free, a.memory.reserved) == (32 * GIB, None)
    assert a.peak_bandwidth is not None
    assert a.peak_bandwidth == pytest.approx(1.555e12, rel=1e-3)
    assert collector.snapshot is not None
    assert collector.snapshot.peak_bandwidth() == pytest.approx(H100 + a.peak_bandwidth)
    backend = collector.backend
    assert isinstance(backend, FakeNvml)
    assert len(backend.live_samples) == 1  # the previous sample is freed each poll
    await collector.close()
    assert (backend.live_samples, backend.shutdowns, collector.errors) == (set(), 1, 0)


async def test_an_error_on_one_gpu_does_not_hide_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lost = FakeGpu("GPU-lost", fail={"uuid"})
    flaky = FakeGpu("GPU-flaky", fail={"memory", "power"})
    collector = rig([lost, flaky, FakeGpu("GPU-ok")])
    with caplog.at_level(logging.WARNING, "llmobs.collectors"):
        got = await polled(collector, times=3)
    assert sorted(got) == ["1", "2"]
    assert got["1"].memory is None and got["1"].power_w is None
    assert got["1"].temperature_c == 61  # the rest of the flaky GPU is still read
    assert collector.up and collector.errors == 3 * 3  # uuid, memory, power, per poll
    assert len(caplog.records) == 3  # each failure logged once, not every poll


async def test_mig_devices_are_reported_and_selectable() -> None:
    slices = [FakeGpu(f"MIG-{n}", f"NVIDIA H100 MIG 3g.40gb #{n}", 40 * GIB) for n in range(2)]
    gpu = FakeGpu("GPU-mig", gpm=False, mig=slices)
    got = await polled(rig([gpu]))
    assert sorted(got) == ["0", "0/0", "0/1"]
    parent, child = got["0"], got["0/1"]
    assert (parent.kind, parent.memory, parent.utilization) == ("mig_parent", None, None)
    assert parent.power_w == 500  # power and clocks are the whole GPU's
    assert child.kind == "mig" and child.memory is not None and child.memory.total == 40 * GIB
    assert (child.utilization, child.power_w, child.peak_bandwidth) == (None, None, None)
    only = await polled(rig([gpu], DeviceSelection.of((), "MIG-1", None)))
    assert sorted(only) == ["0", "0/1"]  # the slice we run on, and its GPU's power


async def test_no_gpu_is_a_state_said_once_and_the_collector_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No NVML, or no GPU: one line at start, then nothing: no poll more, no status series,
    so that no alert fires for a node that has no GPU."""
    collector = GpuCollector(FakeNvml([], init_error="Driver Not Loaded"), DeviceSelection())
    with caplog.at_level(logging.INFO, "llmobs.collectors"):
        await collector.collect_once()
    assert (collector.absent, collector.up, collector.errors, collector.polls) == (
        True, False, 0, 1,
    )  # fmt: skip
    assert [r.getMessage() for r in caplog.records] == [
        "collector gpu is off: NVML unavailable (Driver Not Loaded); nothing to collect here"
    ]
    await asyncio.wait_for(collector.run(), 5)  # returns at once: absent, it polls no more
    assert collector.polls == 1
    telemetry = build_telemetry()
    register_status(telemetry.meter, [collector])
    names = {s.name for f in telemetry.registry.collect() for s in f.samples}
    assert not {n for n in names if n.startswith("llmobs_collector")}  # no series to alert on
    empty = GpuCollector(FakeNvml([]), DeviceSelection())
    await empty.collect_once()
    assert (empty.absent, empty.up, empty.errors) == (True, False, 0)
    await collector.close()


async def test_a_gpu_that_stops_answering_is_down_not_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml([FakeGpu("GPU-h100")])
    collector = GpuCollector(nvml, DeviceSelection())
    await collector.collect_once()
    assert collector.up
    nvml.gpus.clear()  # the GPU fell off the bus
    with caplog.at_level(logging.INFO, "llmobs.collectors"):
        await collector.collect_once()
    assert (collector.absent, collector.up) == (False, False)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "collector gpu is down: no GPU visible to NVML")
    ]
    await collector.close()


async def test_the_real_backend_without_a_gpu_reports_down() -> None:
    collector = GpuCollector(PynvmlBackend(), DeviceSelection())
    await collector.collect_once()
    if collector.up:  # pragma: no cover - a machine with a GPU
        pytest.skip("this machine has a GPU")
    assert (collector.snapshot, collector.errors) == (None, 0)
    await collector.close()


class BrokenNvml(FakeNvml):
    def device_count(self) -> int:
        raise NvmlError("Unknown Error")


async def test_a_failing_collector_never_breaks_the_exposition() -> None:
    telemetry = build_telemetry()
    good = GpuCollector(FakeNvml([FakeGpu("GPU-x", gpm=True)]), DeviceSelection())
    bad = GpuCollector(BrokenNvml([FakeGpu("GPU-y")]), DeviceSelection())
    bad.name = "gpu-broken"
    register_gpu(telemetry.meter, good)
    register_status(telemetry.meter, [good, bad])
    for _ in range(2):
        await good.collect_once()
        await bad.collect_once()
    text = generate_latest(telemetry.registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    gpu = {"gpu": "0", "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-x"}

    def value(metric: str, /, **labels: str) -> float:
        return samples[(metric, tuple(sorted(labels.items())))]

    assert value("llmobs_gpu_memory_used_bytes", **gpu) == 30 * GIB
    assert value("llmobs_gpu_memory_bandwidth_utilization", **gpu, source="gpm") == 0.45
    assert value("llmobs_gpu_memory_bandwidth_bytes_per_second", **gpu, source="gpm") == (
        pytest.approx(0.45 * H100)
    )
    assert value("llmobs_gpu_power_watts", **gpu) == 500
    assert value("llmobs_collector_up", collector="gpu") == 1
    assert value("llmobs_collector_up", collector="gpu-broken") == 0
    assert value("llmobs_collector_errors_total", collector="gpu-broken") == 2
    assert value("llmobs_collector_scrape_duration_seconds", collector="gpu") >= 0
    telemetry.shutdown()
    await good.close()
    await bad.close()
