"""Background collectors: the GPU (NVML), the engine's own /metrics, and MBU/MFU.

``Collectors`` assembles them from the settings, registers their observable instruments on
the sidecar's meter, and runs them in a ``cleanup_ctx`` lifecycle of the admin application.
The NVML backend is injected (``FakeNvml`` in tests); by default the real one, which reports
itself down, once, where there is no GPU or no driver.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from opentelemetry.metrics import Meter

from llmobs.collectors.base import PollingCollector, Runner, Unavailable, register_status
from llmobs.collectors.devices import DeviceSelection
from llmobs.collectors.efficiency import Peaks, register_efficiency
from llmobs.collectors.engine import EngineCollector, register_engine
from llmobs.collectors.gpu import GpuCollector, register_gpu
from llmobs.collectors.nvml import NvmlBackend, NvmlError, PynvmlBackend
from llmobs.config.settings import Settings
from llmobs.export.live import Gauge
from llmobs.observe.mbu import EfficiencyTracker, ModelShape
from llmobs.observe.record import RequestRecord
from llmobs.wire.tls import EngineTls

__all__ = [
    "Collectors",
    "EngineCollector",
    "GpuCollector",
    "NvmlBackend",
    "NvmlError",
    "PollingCollector",
    "Unavailable",
]


class Collectors:
    """The sidecar's collectors and gauges; ``consume`` takes each request (MBU/MFU)."""

    def __init__(
        self,
        settings: Settings,
        meter: Meter,
        nvml: NvmlBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
        engine_tls: EngineTls | None = None,
    ) -> None:
        """``engine_tls``: how an https engine's /metrics and model list are asked."""
        self._clock = clock
        self.tracker = EfficiencyTracker()
        self.gpu: GpuCollector | None = None
        self.engine: EngineCollector | None = None
        if settings.gpu_sample_interval > 0:
            selection = DeviceSelection.of(
                settings.gpus, settings.cuda_visible_devices, settings.nvidia_visible_devices
            )
            backend = nvml if nvml is not None else PynvmlBackend()
            self.gpu = GpuCollector(
                backend, selection, settings.gpu_sample_interval, settings.gpu_peak_bandwidth
            )
            register_gpu(meter, self.gpu)
        if settings.engine_scrape_interval > 0:
            url = settings.engine_metrics_url or settings.upstream_base + "/metrics"
            models = settings.upstream_base + "/v1/models"  # the adapters' base models
            self.engine = EngineCollector(
                url, settings.engine_scrape_interval, models_url=models, tls=engine_tls
            )
            register_engine(meter, self.engine)
        self.collectors: tuple[PollingCollector[Any], ...] = tuple(
            c for c in (self.gpu, self.engine) if c is not None
        )
        register_status(meter, self.collectors)
        shape = ModelShape.of(
            model_bytes=settings.model_bytes,
            model_params=settings.model_params,
            weight_dtype=settings.weight_dtype,
            layers=settings.model_layers,
            kv_heads=settings.model_kv_heads,
            head_dim=settings.model_head_dim,
            kv_dtype=settings.kv_dtype,
        )
        peaks = Peaks(self.gpu, settings.gpu_peak_bandwidth, settings.gpu_peak_flops)
        register_efficiency(meter, self.tracker, shape, peaks, clock)
        self._runner = Runner(self.collectors)

    def live_gauges(self) -> dict[str, float]:
        """The engine's and the GPUs' numbers now, for the live page (by ``live.Gauge``),
        from the collectors' last readings; absent where a collector is down."""
        out: dict[str, float] = {}
        engine = self.engine.snapshot if self.engine is not None and self.engine.up else None
        if engine is not None:
            for name, value in ((Gauge.ENGINE_WAITING, engine.waiting),
                                (Gauge.ENGINE_RUNNING, engine.running),
                                (Gauge.ENGINE_KV_CACHE, engine.kv_usage)):  # fmt: skip
                if value is not None:
                    out[name] = value
        gpus = self.gpu.snapshot if self.gpu is not None and self.gpu.up else None
        devices = gpus.compute_devices if gpus is not None else ()
        memory = [g.memory for g in devices if g.memory is not None and g.memory.total]
        if memory:
            out[Gauge.GPU_MEMORY_USED] = sum(m.used for m in memory) / sum(m.total for m in memory)
        bandwidth = [g.bandwidth_utilization for g in devices]
        if bandwidth and all(b is not None for b in bandwidth):
            out[Gauge.GPU_BANDWIDTH] = sum(b for b in bandwidth if b is not None) / len(bandwidth)
        return out

    def consume(self, record: RequestRecord) -> None:
        """A finished request, kept under its model's label for MBU/MFU (a consumer of the
        request records, ``observe.record``)."""
        self.tracker.record(record.label, record.stats, self._clock())

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: start polling with the application, stop (and close) with it."""
        self._runner.start()
        try:
            yield
        finally:
            await self._runner.stop()
