"""The MBU and MFU gauges (``collectors.efficiency``): the peaks they divide by (the GPUs NVML
sees, else the operator's figures), and the gauges at scrape time from the requests of the
last minute, by model; no series where the model's size or a peak is unknown, rather than a
made-up number. The arithmetic itself: tests/unit/observe/test_mbu.py."""

from __future__ import annotations

import pytest

from llmobs.collectors.devices import DeviceSelection
from llmobs.collectors.efficiency import Peaks, register_efficiency
from llmobs.collectors.gpu import GpuCollector
from llmobs.export.metrics.catalogue import MBU, MFU
from llmobs.export.telemetry import build_telemetry
from llmobs.observe.mbu import EfficiencyTracker, ModelShape
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.fake_nvml import GIB, FakeGpu, FakeNvml

H100 = 2619e6 * 5120 / 8 * 2  # bytes/s: its memory clock x bus width x two transfers a clock
SHAPE = ModelShape(weight_bytes=16e9, params=8e9, kv_bytes_per_token=131_072.0)
NOW = 1000.0


async def polled(*gpus: FakeGpu) -> GpuCollector:
    collector = GpuCollector(FakeNvml(list(gpus)), DeviceSelection(), interval=1.0)
    await collector.collect_once()
    return collector


async def test_the_peaks_are_the_gpus_seen_else_the_operator_s() -> None:
    assert (Peaks(None).bandwidth(), Peaks(None).flops()) == (None, None)
    alone = Peaks(None, 3e12, 1e15)  # no GPU collector: the figures given, for one GPU
    assert (alone.bandwidth(), alone.flops()) == (3e12, 1e15)
    two = await polled(FakeGpu("GPU-a"), FakeGpu("GPU-b"))
    measured = Peaks(two, 3e12, 1e15)  # NVML's peak wins; FLOP/s are per GPU
    assert measured.bandwidth() == pytest.approx(2 * H100)
    assert measured.flops() == 2e15
    assert Peaks(two).flops() is None  # no FLOP/s figure: no MFU
    unread = await polled(FakeGpu("GPU-a"), FakeGpu("GPU-b", fail={"bus_width"}))
    assert Peaks(unread, 3e12).bandwidth() == 3e12  # one GPU's peak unknown: the figure
    assert Peaks(unread).bandwidth() is None
    await two.close()
    await unread.close()


async def test_a_collector_down_counts_as_no_gpu_and_mig_slices_as_gpus() -> None:
    down = GpuCollector(FakeNvml([], init_error="Driver Not Loaded"), DeviceSelection())
    await down.collect_once()
    assert (Peaks(down, 3e12, 1e15).bandwidth(), Peaks(down, 3e12, 1e15).flops()) == (3e12, 1e15)
    slices = [FakeGpu(f"MIG-{n}", f"NVIDIA H100 MIG 3g.40gb #{n}", 40 * GIB) for n in range(2)]
    mig = await polled(FakeGpu("GPU-mig", mig=slices))
    assert Peaks(mig, 3e12, 1e15).flops() == 2e15  # the two slices run work, not their GPU
    await down.close()
    await mig.close()


def tracked(ended: float = NOW) -> EfficiencyTracker:
    """One request of model ``m`` that ended at ``ended``: 100 prompt tokens in 0.5 s to its
    first token, then 10 steps of 0.02 s for 11 output tokens."""
    tracker = EfficiencyTracker()
    stats = RequestStats(
        "chat", "m", Outcome.OK, 200, True, 0.7, 0.5, 0.02, 100, 11, TokenSource.USAGE, 11,
        10, 0.2, 0.004, 0.02, 0, 1.0,
    )  # fmt: skip
    tracker.record("m", stats, ended)
    return tracker


def gauges(tracker: EfficiencyTracker, shape: ModelShape, peaks: Peaks) -> dict[str, float]:
    """The MBU and MFU of model ``m`` at ``NOW``, as a scrape reads them (absent: no series)."""
    telemetry = build_telemetry(self_metrics=False)
    register_efficiency(telemetry.meter, tracker, shape, peaks, lambda: NOW)
    try:
        found = {}
        for metric in (MBU, MFU):
            value = telemetry.registry.get_sample_value(
                metric.prometheus, {"gen_ai_request_model": "m"}
            )
            if value is not None:
                found[metric.prometheus] = value
        return found
    finally:
        telemetry.shutdown()


def test_mbu_and_mfu_of_the_last_minute_s_requests() -> None:
    """MBU: a step reads the weights and the KV cache of 105.5 tokens (100 prompt, half the
    11 output) in 0.02 s, against 2 TB/s. MFU: 2 x 8e9 FLOPs a prompt token, 100 of them in
    0.5 s, against 1 PFLOP/s."""
    found = gauges(tracked(), SHAPE, Peaks(None, 2e12, 1e15))
    assert found == {
        MBU.prometheus: pytest.approx((16e9 + 131_072 * 105.5) / 0.02 / 2e12),
        MFU.prometheus: pytest.approx(2 * 8e9 * 100 / 0.5 / 1e15),
    }
    assert found[MBU.prometheus] == pytest.approx(0.4003457024)
    assert found[MFU.prometheus] == pytest.approx(0.0032)


@pytest.mark.parametrize(
    ("shape", "peaks", "present"),
    [
        (ModelShape(params=8e9), Peaks(None, 2e12, 1e15), {MFU.prometheus}),  # no bytes
        (ModelShape(weight_bytes=16e9), Peaks(None, 2e12, 1e15), {MBU.prometheus}),
        (SHAPE, Peaks(None, None, 1e15), {MFU.prometheus}),  # no bandwidth
        (SHAPE, Peaks(None, 2e12), {MBU.prometheus}),  # no FLOP/s
        (ModelShape(), Peaks(None), set()),
    ],
)
def test_no_series_without_the_model_s_size_or_a_peak(
    shape: ModelShape, peaks: Peaks, present: set[str]
) -> None:
    assert set(gauges(tracked(), shape, peaks)) == present


def test_requests_older_than_a_minute_no_longer_count() -> None:
    assert gauges(tracked(ended=NOW - 61), SHAPE, Peaks(None, 2e12, 1e15)) == {}
    assert len(gauges(tracked(ended=NOW - 59), SHAPE, Peaks(None, 2e12, 1e15))) == 2
