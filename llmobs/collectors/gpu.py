"""The GPU collector: NVML sampled in a worker thread; memory, utilization, bandwidth, power.

Per poll (``--gpu-sample-interval``, 1 s by default) it reads every selected GPU (``--gpus``,
else ``CUDA_VISIBLE_DEVICES``, else ``NVIDIA_VISIBLE_DEVICES``: ``devices.py``)
and, on a GPU in MIG mode, its MIG devices. A field the device does not support is left out;
a field or a GPU that fails is counted and logged once, and the others are still reported.

Memory bandwidth utilization comes from NVML GPM (``DRAM_BW_UTIL``, Hopper and newer) between
this poll's sample and the previous one, labelled ``source="gpm"``; where GPM is unsupported,
from the memory-controller busy ratio, ``source="mem_util"``: the fraction of time memory was
being read or written at all, which says nothing of how much (an upper bound, often far above
the real bandwidth use). Peak bandwidth is max memory clock x bus width x 2 (double data rate
as NVML reports the clocks of HBM and GDDR parts), or ``--gpu-peak-bandwidth``. See docs/gpu.md.

Every NVML call runs in one dedicated thread: the calls block, and ``shutdown`` must follow
the last sample, never overlap it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmobs.collectors.base import Absent, PollingCollector
from llmobs.collectors.devices import DeviceSelection
from llmobs.collectors.nvml import MemoryInfo, NvmlBackend, NvmlError
from llmobs.export.metrics import catalogue as m

log = logging.getLogger("llmobs.collectors")

T = TypeVar("T")
DATA_RATE = 2  # transfers per memory clock, as NVML reports HBM2/2e/3/3e and GDDR6/6X clocks


def peak_bandwidth(max_memory_clock_hz: float, bus_width_bits: int) -> float:
    """Theoretical DRAM bandwidth in bytes/s: clock x bytes per transfer x transfers/clock."""
    return max_memory_clock_hz * bus_width_bits / 8 * DATA_RATE


@dataclass(frozen=True)
class GpuReading:
    """One device's values at one poll; None where unsupported or failed."""

    gpu: str  # NVML index; "<parent>/<n>" for the n-th MIG device of a GPU
    uuid: str
    name: str
    kind: str = "gpu"  # gpu | mig_parent (a GPU in MIG mode: its own power, clocks) | mig
    memory: MemoryInfo | None = None
    utilization: float | None = None  # 0-1
    memory_controller: float | None = None  # 0-1
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    bandwidth_utilization: float | None = None  # 0-1
    bandwidth_source: str | None = None  # gpm | mem_util
    peak_bandwidth: float | None = None  # bytes/s

    @property
    def labels(self) -> dict[str, str]:
        return {"gpu": self.gpu, "uuid": self.uuid, "name": self.name}


@dataclass(frozen=True)
class GpuSnapshot:
    gpus: tuple[GpuReading, ...]

    @property
    def compute_devices(self) -> tuple[GpuReading, ...]:
        """Devices that run work: whole GPUs and MIG devices (not a MIG GPU's parent)."""
        return tuple(g for g in self.gpus if g.kind != "mig_parent")

    def peak_bandwidth(self) -> float | None:
        """Sum of the compute devices' peaks (tensor parallel spans them all); None if any
        is unknown."""
        peaks = [g.peak_bandwidth for g in self.compute_devices]
        if not peaks or any(p is None for p in peaks):
            return None
        return sum(p for p in peaks if p is not None)


class GpuCollector(PollingCollector[GpuSnapshot]):
    """NVML, polled in one worker thread; ``snapshot`` holds the last ``GpuSnapshot``."""

    def __init__(
        self,
        backend: NvmlBackend,
        selection: DeviceSelection,
        interval: float = 1.0,
        peak_bandwidth_override: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__("gpu", interval, clock=clock)
        self.backend = backend
        self.selection = selection
        self.peak_override = peak_bandwidth_override
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmobs-nvml")
        self._ready = False
        self._gpm: dict[str, bool] = {}  # uuid -> GPM supported
        self._gpm_prev: dict[str, object] = {}  # uuid -> the previous poll's GPM sample
        self._peaks: dict[str, float | None] = {}  # uuid -> derived peak (static)
        self._warned: set[tuple[str, str]] = set()

    async def poll(self) -> GpuSnapshot:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.sample)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._shutdown)
        self._executor.shutdown(wait=True)

    def _shutdown(self) -> None:
        for sample in self._gpm_prev.values():
            self._try("gpm free", "-", self.backend.gpm_free, sample)
        self._gpm_prev.clear()
        if self._ready:
            self._ready = False
            self._try("shutdown", "-", self.backend.shutdown)

    def sample(self) -> GpuSnapshot:
        """One reading of every selected device (blocking: runs in the NVML thread)."""
        b = self.backend
        if not self._ready:
            try:
                b.init()
            except NvmlError as exc:
                raise Absent(f"NVML unavailable ({exc})") from exc
            self._ready = True
        try:
            count = b.device_count()
        except NvmlError:
            self._shutdown()  # the driver went away: initialise again next time
            raise
        if count == 0:
            raise Absent("no GPU visible to NVML")
        readings: list[GpuReading] = []
        for index in range(count):
            readings.extend(self._device(index, count))
        if not readings:
            if self.selection.entries is not None:
                raise Absent(f"no GPU selected by {self.selection.source}")
            raise RuntimeError("no GPU could be read")
        return GpuSnapshot(tuple(readings))

    def _device(self, index: int, count: int) -> list[GpuReading]:
        """The GPU at ``index`` and its MIG devices, as far as selected and readable."""
        b, where = self.backend, f"#{index}"
        handle = self._try("handle", where, b.handle, index)
        uuid = self._try("uuid", where, b.uuid, handle) if handle is not None else None
        if handle is None or uuid is None:
            return []
        whole = self.selection.wants(index, uuid, count)
        migs: list[tuple[str, object, str]] = []
        if self._try("MIG mode", uuid, b.mig_enabled, handle):
            for n, mig in enumerate(self._try("MIG devices", uuid, b.mig_devices, handle) or []):
                mig_uuid = self._try("MIG uuid", uuid, b.uuid, mig)
                if mig_uuid is not None and (whole or self.selection.wants_uuid(mig_uuid)):
                    migs.append((f"{index}/{n}", mig, mig_uuid))
            kind = "mig_parent"
        else:
            kind = "gpu"
        if not whole and not migs:
            return []
        out = [self._read(str(index), handle, uuid, kind)]
        out.extend(self._read(label, h, u, "mig") for label, h, u in migs)
        return out

    def _read(self, label: str, h: object, uuid: str, kind: str) -> GpuReading:
        b = self.backend
        util = self._try("utilization", uuid, b.utilization, h)
        clocks = self._try("clocks", uuid, b.clocks_hz, h)
        mem_util = util[1] / 100 if util is not None else None
        bw, source = (None, None) if kind == "mig_parent" else self._bandwidth(uuid, h, mem_util)
        return GpuReading(
            gpu=label,
            uuid=uuid,
            name=self._try("name", uuid, b.name, h) or "",
            kind=kind,
            memory=None if kind == "mig_parent" else self._try("memory", uuid, b.memory, h),
            utilization=util[0] / 100 if util is not None else None,
            memory_controller=mem_util,
            power_w=self._try("power", uuid, b.power_w, h),
            temperature_c=self._try("temperature", uuid, b.temperature_c, h),
            sm_clock_hz=clocks[0] if clocks is not None else None,
            memory_clock_hz=clocks[1] if clocks is not None else None,
            bandwidth_utilization=bw,
            bandwidth_source=source,
            peak_bandwidth=self._peak(uuid, h, kind),
        )

    def _peak(self, uuid: str, h: object, kind: str) -> float | None:
        """The override, else derived from NVML; a MIG slice's share is not derivable."""
        if self.peak_override is not None or kind == "mig":
            return self.peak_override
        if uuid not in self._peaks:
            clock = self._try("max memory clock", uuid, self.backend.max_memory_clock_hz, h)
            width = self._try("memory bus width", uuid, self.backend.memory_bus_width_bits, h)
            self._peaks[uuid] = peak_bandwidth(clock, width) if clock and width else None
        return self._peaks[uuid]

    def _bandwidth(
        self, uuid: str, h: object, mem_util: float | None
    ) -> tuple[float | None, str | None]:
        """GPM DRAM bandwidth utilization between two polls, else the controller's busy ratio."""
        b = self.backend
        if uuid not in self._gpm:
            self._gpm[uuid] = bool(self._try("GPM support", uuid, b.gpm_supported, h))
        if not self._gpm[uuid]:
            return (mem_util, "mem_util") if mem_util is not None else (None, None)
        previous = self._gpm_prev.pop(uuid, None)
        current = self._try("GPM sample", uuid, b.gpm_sample, h)
        if current is not None:
            self._gpm_prev[uuid] = current
        if previous is None or current is None:
            if previous is not None:
                self._try("GPM free", uuid, b.gpm_free, previous)
            return None, None  # the first poll, or a failed sample: no interval to measure
        util = self._try("GPM DRAM bandwidth", uuid, b.gpm_dram_bw_util, previous, current)
        self._try("GPM free", uuid, b.gpm_free, previous)
        return (util / 100, "gpm") if util is not None else (None, None)

    def _try(self, what: str, where: str, fn: Callable[..., T], *args: object) -> T | None:
        """``fn(*args)``, or None when NVML fails; unsupported is silent, the rest counted."""
        try:
            return fn(*args)
        except NvmlError as exc:
            if exc.not_supported:
                return None
            self.count_error()
            if (where, what) not in self._warned:
                self._warned.add((where, what))
                log.warning("GPU %s: reading %s failed: %s", where, what, exc)
            return None


Values = Callable[[GpuReading], float | None]

_GAUGES: tuple[tuple[m.MetricDef, Values], ...] = (
    (m.GPU_MEMORY_USED, lambda g: g.memory.used if g.memory else None),
    (m.GPU_MEMORY_FREE, lambda g: g.memory.free if g.memory else None),
    (m.GPU_MEMORY_TOTAL, lambda g: g.memory.total if g.memory else None),
    (m.GPU_MEMORY_RESERVED, lambda g: g.memory.reserved if g.memory else None),
    (m.GPU_UTILIZATION, lambda g: g.utilization),
    (m.GPU_MEMORY_CONTROLLER, lambda g: g.memory_controller),
    (m.GPU_BANDWIDTH_PEAK, lambda g: g.peak_bandwidth),
    (m.GPU_POWER, lambda g: g.power_w),
    (m.GPU_TEMPERATURE, lambda g: g.temperature_c),
    (m.GPU_CLOCK_SM, lambda g: g.sm_clock_hz),
    (m.GPU_CLOCK_MEMORY, lambda g: g.memory_clock_hz),
)


def _achieved(g: GpuReading) -> float | None:
    if g.bandwidth_utilization is None or g.peak_bandwidth is None:
        return None
    return g.bandwidth_utilization * g.peak_bandwidth


def register_gpu(meter: Meter, collector: GpuCollector) -> None:
    """One observable gauge per GPU metric of the catalogue, reading the last snapshot."""

    def gauge(metric: m.MetricDef, value: Values, by_source: bool = False) -> None:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            snapshot = collector.snapshot
            out = []
            for g in snapshot.gpus if snapshot is not None else ():
                v = value(g)
                if v is None:
                    continue
                labels = g.labels
                if by_source:
                    labels[m.BANDWIDTH_SOURCE] = g.bandwidth_source or "none"
                out.append(Observation(v, labels))
            return out

        meter.create_observable_gauge(
            metric.name, [observe], unit=metric.unit, description=metric.description
        )

    for metric, value in _GAUGES:
        gauge(metric, value)
    gauge(m.GPU_BANDWIDTH_UTILIZATION, lambda g: g.bandwidth_utilization, by_source=True)
    gauge(m.GPU_BANDWIDTH, _achieved, by_source=True)
