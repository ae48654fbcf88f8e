"""The GPU row, from the sidecar's NVML collector: memory, utilization, bandwidth measured
next to MBU (docs/gpu.md says how the two differ), MFU, power, temperature and clocks.
"""

from __future__ import annotations

from typing import Any

from panels.builders import Json, target, thresholds, timeseries
from panels.names import (
    GPU_BANDWIDTH,
    GPU_BANDWIDTH_PEAK,
    GPU_BANDWIDTH_UTILIZATION,
    GPU_CLOCK,
    GPU_MEMORY,
    GPU_MEMORY_CONTROLLER,
    GPU_MEMORY_MAX,
    GPU_POWER,
    GPU_TEMPERATURE,
    GPU_UTILIZATION,
    MBU,
    MFU,
)
from panels.promql import MODEL, POD


def per_gpu(metric: str, legend: str, by: str = "pod, gpu") -> Any:
    """One series per GPU of each pod (a MIG device is ``gpu="<gpu>/<n>"``)."""
    suffix = " " + legend if legend else ""
    return target(f"max by ({by}) ({metric}{{{POD}}})", "{{pod}}/{{gpu}}" + suffix)


def gpu_row() -> list[Json]:
    """Each GPU the sidecar sees, and how much of it the model's decode needs."""
    nvml = "Sampled from NVML by the sidecar's GPU collector, per GPU it sees (docs/gpu.md)."
    used, total = GPU_MEMORY["used"], GPU_MEMORY["total"]
    return [
        timeseries(
            "GPU memory",
            "Device memory in use, reserved by the driver, free and in total. Engines allocate "
            "their KV cache up front, so a high, flat line is normal. A GPU in MIG mode has no "
            f"memory series of its own, its MIG devices do. {nvml}",
            [
                per_gpu(used, "used"),
                per_gpu(GPU_MEMORY["reserved"], "reserved"),
                per_gpu(GPU_MEMORY["free"], "free"),
                per_gpu(total, "total"),
            ],
            "bytes",
            min=0,
        ),
        timeseries(
            "GPU memory used",
            f"Memory used / total per GPU. Red above the {GPU_MEMORY_MAX:.0%} alert default, "
            "where any allocation outside the engine's pool (CUDA graphs, another process) "
            "fails.",
            [target(f"max by (pod, gpu) ({used}{{{POD}}} / {total}{{{POD}}})", "{{pod}}/{{gpu}}")],
            "percentunit",
            min=0,
            max=1,
            thresholds=thresholds((None, "transparent"), (GPU_MEMORY_MAX, "red")),
        ),
        timeseries(
            "GPU utilization",
            "Kernel: fraction of the sample period in which a kernel ran (not how much of the "
            "GPU it used). Memory controller: fraction in which device memory was read or "
            f"written. NVML reports neither in MIG mode. {nvml}",
            [
                per_gpu(GPU_UTILIZATION, "kernel"),
                per_gpu(GPU_MEMORY_CONTROLLER, "memory controller"),
            ],
            "percentunit",
            min=0,
            max=1,
        ),
        timeseries(
            "Memory bandwidth: measured vs MBU",
            "Measured: DRAM bandwidth used / peak per GPU, by source: gpm (NVML GPM, Hopper and "
            "newer) is the bandwidth moved; mem_util (the memory-controller busy ratio, older "
            "GPUs) is only an upper bound, never compare it with MBU. MBU: the bandwidth the "
            "model needs at its measured TPOT (weights + KV cache read per decode step / TPOT / "
            "peak), per model, needs --model-params; over several GPUs it divides by the sum "
            "of their peaks, so compare it with their average. Under steady decode GPM reads at "
            "or a little above MBU; well above points at bytes the model does not need, below "
            "at a wrong shape or peak.",
            [
                target(
                    f"max by (pod, gpu, source) ({GPU_BANDWIDTH_UTILIZATION}{{{POD}}})",
                    "{{pod}}/{{gpu}} measured ({{source}})",
                ),
                target(
                    f"max by (pod, gen_ai_request_model) ({MBU}{{{MODEL}}})",
                    "{{pod}} MBU {{gen_ai_request_model}}",
                ),
            ],
            "percentunit",
            width=12,
            min=0,
            max=1,
        ),
        timeseries(
            "Memory bandwidth: achieved vs peak",
            "Achieved DRAM bandwidth (the utilization on the left x the peak), by source, and "
            "the peak: max memory clock x bus width x 2 from NVML, or --gpu-peak-bandwidth.",
            [
                per_gpu(GPU_BANDWIDTH, "achieved ({{source}})", by="pod, gpu, source"),
                per_gpu(GPU_BANDWIDTH_PEAK, "peak"),
            ],
            "Bps",
            width=12,
            min=0,
        ),
        timeseries(
            "MFU (prefill)",
            "Model FLOPs utilization of prefill over the last minute: 2 x params x prompt "
            "tokens / prefill time / peak FLOP/s. Prefill time is TTFT (queueing included: a "
            "lower bound) unless the engine reports its own. Needs --gpu-peak-flops.",
            [
                target(
                    f"max by (pod, gen_ai_request_model) ({MFU}{{{MODEL}}})",
                    "{{pod}} {{gen_ai_request_model}}",
                )
            ],
            "percentunit",
            width=6,
            min=0,
        ),
        timeseries(
            "GPU power",
            f"Power draw per GPU. {nvml}",
            [per_gpu(GPU_POWER, "")],
            "watt",
            width=6,
            min=0,
        ),
        timeseries(
            "GPU temperature",
            f"GPU die temperature. {nvml}",
            [per_gpu(GPU_TEMPERATURE, "")],
            "celsius",
            width=6,
        ),
        timeseries(
            "GPU clocks",
            "Current SM and memory clocks: an SM clock below its usual value under load means "
            "power or thermal throttling.",
            [
                per_gpu(GPU_CLOCK["sm"], "SM"),
                per_gpu(GPU_CLOCK["memory"], "memory"),
            ],
            "hertz",
            width=6,
        ),
    ]
