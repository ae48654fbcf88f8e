"""The real NVML backend (``collectors.nvml.PynvmlBackend``): every failure is an
``NvmlError`` whatever pynvml raised, no GPU (or no driver) included; importing llmobs never
imports pynvml; and, on a machine with a GPU, each query answers in its range, GPM between
two samples included. The collector on a fake NVML: test_gpu.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pynvml
import pytest

from llmobs.collectors.gpu import peak_bandwidth
from llmobs.collectors.nvml import NvmlError, PynvmlBackend


def gpu_present() -> bool:
    backend = PynvmlBackend()
    try:
        backend.init()
    except NvmlError:
        return False
    backend.shutdown()  # pragma: no cover - a machine with a GPU
    return True  # pragma: no cover


def test_without_a_gpu_init_fails_as_an_nvml_error() -> None:
    if gpu_present():  # pragma: no cover
        pytest.skip("this machine has a GPU")
    backend = PynvmlBackend()
    backend.shutdown()  # before init: nothing to shut
    with pytest.raises(NvmlError) as raised:
        backend.init()
    assert isinstance(raised.value.__cause__, pynvml.NVMLError)  # the library's, wrapped
    assert not raised.value.not_supported and str(raised.value)


def test_an_nvml_error_says_whether_the_feature_is_missing() -> None:
    assert not NvmlError("Unknown Error").not_supported
    assert NvmlError("Not Supported", not_supported=True).not_supported


def test_importing_llmobs_does_not_import_pynvml() -> None:
    code = "import sys, llmobs.app, llmobs.collectors; print('pynvml' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


@pytest.fixture
def nvml() -> Iterator[PynvmlBackend]:
    """The real NVML, where there is a GPU."""
    backend = PynvmlBackend()
    try:
        backend.init()
    except NvmlError as exc:
        pytest.skip(f"no GPU: {exc}")
    yield backend
    backend.shutdown()


def test_a_real_gpu_answers_every_query(nvml: PynvmlBackend) -> None:
    count = nvml.device_count()
    assert count >= 1
    handle = nvml.handle(0)
    assert nvml.uuid(handle).startswith("GPU-") and nvml.name(handle)
    memory = nvml.memory(handle)
    assert 0 < memory.used <= memory.total and 0 <= memory.free <= memory.total
    assert memory.reserved is None or 0 <= memory.reserved <= memory.total
    if not nvml.mig_enabled(handle):  # a GPU in MIG mode has no utilization of its own
        busy, controller = nvml.utilization(handle)
        assert 0 <= busy <= 100 and 0 <= controller <= 100
    assert 0 < nvml.power_w(handle) < 5000 and 0 < nvml.temperature_c(handle) < 150
    sm, mem = nvml.clocks_hz(handle)
    assert sm > 1e7 and mem > 1e7
    peak = peak_bandwidth(nvml.max_memory_clock_hz(handle), nvml.memory_bus_width_bits(handle))
    assert 1e11 < peak < 1e14  # bytes/s: any GPU's memory
    with pytest.raises(NvmlError):
        nvml.handle(count)  # past the last: NVML's error, as an NvmlError


def test_gpm_measures_bandwidth_between_two_samples(nvml: PynvmlBackend) -> None:
    handle = nvml.handle(0)
    if not nvml.gpm_supported(handle):
        pytest.skip("no GPM before Hopper")
    first = nvml.gpm_sample(handle)
    time.sleep(0.1)  # GPM needs time between its samples, any amount of it
    second = nvml.gpm_sample(handle)
    try:
        assert 0 <= nvml.gpm_dram_bw_util(first, second) <= 100
    finally:
        nvml.gpm_free(first)
        nvml.gpm_free(second)
