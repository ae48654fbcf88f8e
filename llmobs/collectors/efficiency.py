"""The MBU and MFU gauges: the sidecar's own TPOT and prefill times against the GPU's peaks.

Computed at scrape time from two snapshots: the per-model estimate of the requests that ended
in the last minute (``EfficiencyTracker``, fed once per finished request) and the GPU
collector's peak bandwidth (NVML, or ``--gpu-peak-bandwidth``). Without a known model size or
a peak there is no series rather than a made-up number. The arithmetic is in ``llmobs.observe.mbu``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmobs.collectors.gpu import GpuCollector
from llmobs.export.metrics.catalogue import MBU, MFU, MODEL
from llmobs.observe.mbu import EfficiencyTracker, ModelShape, mbu, mfu


class Peaks:
    """The peak bandwidth and FLOP/s of the GPUs the model runs on (all the selected ones)."""

    def __init__(
        self,
        gpu: GpuCollector | None,
        bandwidth_override: float | None = None,
        flops_per_gpu: float | None = None,
    ) -> None:
        self._gpu = gpu
        self._bandwidth = bandwidth_override
        self._flops = flops_per_gpu

    def _devices(self) -> int:
        snapshot = self._gpu.snapshot if self._gpu is not None else None
        return len(snapshot.compute_devices) if snapshot is not None else 0

    def bandwidth(self) -> float | None:
        """Sum over the GPUs seen; with none seen, the override alone (one GPU)."""
        snapshot = self._gpu.snapshot if self._gpu is not None else None
        measured = snapshot.peak_bandwidth() if snapshot is not None else None
        return measured if measured is not None else self._bandwidth

    def flops(self) -> float | None:
        if self._flops is None:
            return None
        return self._flops * max(self._devices(), 1)


def register_efficiency(
    meter: Meter,
    tracker: EfficiencyTracker,
    shape: ModelShape,
    peaks: Peaks,
    clock: Callable[[], float],
) -> None:
    """``llmobs_mbu`` and ``llmobs_mfu`` per model."""

    def observe_mbu(options: CallbackOptions) -> Iterable[Observation]:
        peak = peaks.bandwidth()
        if not peak or shape.weight_bytes is None:
            return []
        out = []
        for model, est in tracker.decode(clock()).items():
            per_step = shape.bytes_per_step(est.kv_tokens)
            if per_step is not None:
                out.append(Observation(mbu(per_step, est.step_s, peak), {MODEL: model}))
        return out

    def observe_mfu(options: CallbackOptions) -> Iterable[Observation]:
        peak = peaks.flops()
        if not peak or shape.params is None:
            return []
        return [
            Observation(mfu(shape.params, est.prompt_tokens, est.seconds, peak), {MODEL: model})
            for model, est in tracker.prefill(clock()).items()
        ]

    for metric, callback in ((MBU, observe_mbu), (MFU, observe_mfu)):
        meter.create_observable_gauge(
            metric.name, [callback], unit=metric.unit, description=metric.description
        )
