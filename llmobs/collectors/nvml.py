"""NVML behind a small Protocol: the real library (``pynvml`` from nvidia-ml-py) or a fake.

Every method is a blocking call; the GPU collector runs them in its own worker thread. Errors
are ``NvmlError`` whatever the backend, with ``not_supported`` set when the device simply
lacks the feature (utilization of a MIG device, GPM before Hopper), which is no failure.
``pynvml`` is imported by ``PynvmlBackend.init`` only, so importing llmobs never touches it.

Handles are opaque to the collector. A MIG device is reached through its parent
(``mig_devices``) and answers what NVML answers for it: memory, name and UUID; GPM through
``nvmlGpmMigSampleGet``; power, clocks and utilization are the parent's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class NvmlError(Exception):
    """An NVML call failed; ``not_supported`` when the device lacks the feature."""

    def __init__(self, message: str, *, not_supported: bool = False) -> None:
        super().__init__(message)
        self.not_supported = not_supported


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    free: int
    used: int
    reserved: int | None = None  # memory info v2 only (driver >= 510)


class NvmlBackend(Protocol):
    """What the GPU collector asks NVML. Percentages are 0-100, as NVML gives them."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> object: ...
    def uuid(self, handle: object) -> str: ...
    def name(self, handle: object) -> str: ...
    def memory(self, handle: object) -> MemoryInfo: ...
    def utilization(self, handle: object) -> tuple[float, float]:
        """(GPU busy %, memory-controller busy %) over NVML's last sample period."""
        ...

    def power_w(self, handle: object) -> float: ...
    def temperature_c(self, handle: object) -> float: ...
    def clocks_hz(self, handle: object) -> tuple[float, float]:
        """Current (SM, memory) clocks."""
        ...

    def max_memory_clock_hz(self, handle: object) -> float: ...
    def memory_bus_width_bits(self, handle: object) -> int: ...
    def mig_enabled(self, handle: object) -> bool: ...
    def mig_devices(self, handle: object) -> list[object]: ...
    def gpm_supported(self, handle: object) -> bool: ...
    def gpm_sample(self, handle: object) -> object: ...
    def gpm_dram_bw_util(self, first: object, second: object) -> float:
        """DRAM bandwidth used between two GPM samples, % of the theoretical maximum."""
        ...

    def gpm_free(self, sample: object) -> None: ...


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class _Mig:
    handle: Any
    parent: Any
    instance: int  # GPU instance id, for GPM


class PynvmlBackend:
    """The real NVML through ``pynvml``; raises ``NvmlError`` for every NVML failure."""

    def __init__(self) -> None:
        self._nv: Any = None

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            unsupported = isinstance(exc, nv.NVMLError_NotSupported)
            raise NvmlError(str(exc), not_supported=unsupported) from exc

    def init(self) -> None:
        try:
            import pynvml  # noqa: PLC0415 (lazy: no import-time side effects)
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise NvmlError(f"nvidia-ml-py is not installed: {exc}") from exc
        self._nv = pynvml
        self._call(pynvml.nvmlInit)

    def shutdown(self) -> None:
        if self._nv is not None:
            self._call(self._nv.nvmlShutdown)

    def device_count(self) -> int:
        return int(self._call(self._nv.nvmlDeviceGetCount))

    def handle(self, index: int) -> object:
        return self._call(self._nv.nvmlDeviceGetHandleByIndex, index)

    def _raw(self, handle: object) -> Any:
        return handle.handle if isinstance(handle, _Mig) else handle

    def uuid(self, handle: object) -> str:
        return _text(self._call(self._nv.nvmlDeviceGetUUID, self._raw(handle)))

    def name(self, handle: object) -> str:
        return _text(self._call(self._nv.nvmlDeviceGetName, self._raw(handle)))

    def memory(self, handle: object) -> MemoryInfo:
        nv, raw = self._nv, self._raw(handle)
        try:
            m = self._call(nv.nvmlDeviceGetMemoryInfo, raw, nv.nvmlMemory_v2)
            return MemoryInfo(int(m.total), int(m.free), int(m.used), int(m.reserved))
        except NvmlError:  # drivers before 510: no v2
            m = self._call(nv.nvmlDeviceGetMemoryInfo, raw)
            return MemoryInfo(int(m.total), int(m.free), int(m.used))

    def utilization(self, handle: object) -> tuple[float, float]:
        u = self._call(self._nv.nvmlDeviceGetUtilizationRates, self._raw(handle))
        return float(u.gpu), float(u.memory)

    def power_w(self, handle: object) -> float:
        return float(self._call(self._nv.nvmlDeviceGetPowerUsage, self._raw(handle))) / 1000.0

    def temperature_c(self, handle: object) -> float:
        nv = self._nv
        return float(
            self._call(nv.nvmlDeviceGetTemperature, self._raw(handle), nv.NVML_TEMPERATURE_GPU)
        )

    def clocks_hz(self, handle: object) -> tuple[float, float]:
        nv, raw = self._nv, self._raw(handle)
        sm = self._call(nv.nvmlDeviceGetClockInfo, raw, nv.NVML_CLOCK_SM)
        mem = self._call(nv.nvmlDeviceGetClockInfo, raw, nv.NVML_CLOCK_MEM)
        return float(sm) * 1e6, float(mem) * 1e6

    def max_memory_clock_hz(self, handle: object) -> float:
        nv = self._nv
        mhz = self._call(nv.nvmlDeviceGetMaxClockInfo, self._raw(handle), nv.NVML_CLOCK_MEM)
        return float(mhz) * 1e6

    def memory_bus_width_bits(self, handle: object) -> int:
        return int(self._call(self._nv.nvmlDeviceGetMemoryBusWidth, self._raw(handle)))

    def mig_enabled(self, handle: object) -> bool:
        if isinstance(handle, _Mig):
            return False
        current, _pending = self._call(self._nv.nvmlDeviceGetMigMode, handle)
        return bool(current == self._nv.NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, handle: object) -> list[object]:
        nv = self._nv
        out: list[object] = []
        for i in range(self._call(nv.nvmlDeviceGetMaxMigDeviceCount, handle)):
            try:
                mig = self._call(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            except NvmlError:  # an empty slot: NOT_FOUND
                continue
            instance = self._call(nv.nvmlDeviceGetGpuInstanceId, mig)
            out.append(_Mig(mig, handle, int(instance)))
        return out

    def gpm_supported(self, handle: object) -> bool:
        parent = handle.parent if isinstance(handle, _Mig) else handle
        try:
            support = self._call(self._nv.nvmlGpmQueryDeviceSupport, parent)
        except NvmlError as exc:
            if exc.not_supported or "Function Not Found" in str(exc):
                return False
            raise
        return bool(support.isSupportedDevice)

    def gpm_sample(self, handle: object) -> object:
        nv = self._nv
        sample = self._call(nv.nvmlGpmSampleAlloc)
        try:
            if isinstance(handle, _Mig):
                self._call(nv.nvmlGpmMigSampleGet, handle.parent, handle.instance, sample)
            else:
                self._call(nv.nvmlGpmSampleGet, handle, sample)
        except NvmlError:
            self._call(nv.nvmlGpmSampleFree, sample)
            raise
        return sample

    def gpm_dram_bw_util(self, first: object, second: object) -> float:
        nv = self._nv
        query = nv.c_nvmlGpmMetricsGet_t()
        query.version = nv.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = 1
        query.sample1 = first
        query.sample2 = second
        query.metrics[0].metricId = nv.NVML_GPM_METRIC_DRAM_BW_UTIL
        self._call(nv.nvmlGpmMetricsGet, query)
        metric = query.metrics[0]
        if metric.nvmlReturn != nv.NVML_SUCCESS:
            raise NvmlError(f"GPM DRAM_BW_UTIL: NVML error {metric.nvmlReturn}")
        return float(metric.value)

    def gpm_free(self, sample: object) -> None:
        self._call(self._nv.nvmlGpmSampleFree, sample)
