"""A fake NVML: GPUs as plain data behind the ``NvmlBackend`` Protocol.

Handles are the ``FakeGpu`` objects themselves. A GPU in MIG mode answers as NVML does:
no utilization on the parent; on its MIG devices only memory, name, UUID (and GPM where the
parent has it). ``fail`` names methods that raise a real error (not "not supported") on that
GPU; ``init_error`` makes the library itself unavailable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmobs.collectors.nvml import MemoryInfo, NvmlError

GIB = 1024**3


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GIB
    used: int = 30 * GIB
    reserved: int | None = GIB // 2
    gpu_util: float = 90.0  # %
    mem_util: float = 60.0  # %
    power_w: float = 500.0
    temperature_c: float = 61.0
    sm_clock_mhz: float = 1980.0
    mem_clock_mhz: float = 2619.0
    max_mem_clock_mhz: float = 2619.0
    bus_width_bits: int = 5120
    gpm: bool = False
    dram_bw_util: float = 45.0  # %, what GPM measures between two samples
    mig: list[FakeGpu] = field(default_factory=list)  # MIG devices: MIG mode is on
    fail: set[str] = field(default_factory=set)
    parent: FakeGpu | None = None

    def __post_init__(self) -> None:
        for device in self.mig:
            device.parent = self


@dataclass(frozen=True, eq=False)
class GpmSample:
    gpu: FakeGpu
    seq: int


class FakeNvml:
    """``NvmlBackend`` over ``FakeGpu``s; counts what a test wants to check."""

    def __init__(self, gpus: list[FakeGpu], init_error: str | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        self.live_samples: set[GpmSample] = set()
        self._seq = 0

    def _check(self, gpu: FakeGpu, what: str) -> None:
        if what in gpu.fail:
            raise NvmlError(f"{what}: GPU is lost")

    @staticmethod
    def _gpu(handle: object) -> FakeGpu:
        assert isinstance(handle, FakeGpu)
        return handle

    def _whole(self, handle: object, what: str) -> FakeGpu:
        """A query MIG devices (and GPUs in MIG mode, for utilization) do not answer."""
        gpu = self._gpu(handle)
        self._check(gpu, what)
        if gpu.parent is not None:
            raise NvmlError("Not Supported", not_supported=True)
        return gpu

    def init(self) -> None:
        if self.init_error is not None:
            raise NvmlError(self.init_error)
        self.inits += 1

    def shutdown(self) -> None:
        self.shutdowns += 1

    def device_count(self) -> int:
        return len(self.gpus)

    def handle(self, index: int) -> object:
        return self.gpus[index]

    def uuid(self, handle: object) -> str:
        gpu = self._gpu(handle)
        self._check(gpu, "uuid")
        return gpu.uuid

    def name(self, handle: object) -> str:
        return self._gpu(handle).name

    def memory(self, handle: object) -> MemoryInfo:
        gpu = self._gpu(handle)
        self._check(gpu, "memory")
        return MemoryInfo(gpu.total, gpu.total - gpu.used, gpu.used, gpu.reserved)

    def utilization(self, handle: object) -> tuple[float, float]:
        gpu = self._whole(handle, "utilization")
        if gpu.mig:
            raise NvmlError("Not Supported", not_supported=True)
        return gpu.gpu_util, gpu.mem_util

    def power_w(self, handle: object) -> float:
        return self._whole(handle, "power").power_w

    def temperature_c(self, handle: object) -> float:
        return self._whole(handle, "temperature").temperature_c

    def clocks_hz(self, handle: object) -> tuple[float, float]:
        gpu = self._whole(handle, "clocks")
        return gpu.sm_clock_mhz * 1e6, gpu.mem_clock_mhz * 1e6

    def max_memory_clock_hz(self, handle: object) -> float:
        return self._whole(handle, "max_memory_clock").max_mem_clock_mhz * 1e6

    def memory_bus_width_bits(self, handle: object) -> int:
        return self._whole(handle, "bus_width").bus_width_bits

    def mig_enabled(self, handle: object) -> bool:
        return bool(self._gpu(handle).mig)

    def mig_devices(self, handle: object) -> list[object]:
        return list(self._gpu(handle).mig)

    def gpm_supported(self, handle: object) -> bool:
        gpu = self._gpu(handle)
        return (gpu.parent or gpu).gpm

    def gpm_sample(self, handle: object) -> object:
        gpu = self._gpu(handle)
        self._check(gpu, "gpm_sample")
        self._seq += 1
        sample = GpmSample(gpu, self._seq)
        self.live_samples.add(sample)
        return sample

    def gpm_dram_bw_util(self, first: object, second: object) -> float:
        assert isinstance(first, GpmSample) and isinstance(second, GpmSample)
        assert first.gpu is second.gpu and first.seq < second.seq
        return first.gpu.dram_bw_util

    def gpm_free(self, sample: object) -> None:
        assert isinstance(sample, GpmSample)
        self.live_samples.remove(sample)
