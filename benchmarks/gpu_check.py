"""Check the GPU collector and MBU on a real NVIDIA GPU (docs/gpu.md, "On a real GPU").

Not a test: it needs a GPU, PyTorch and the NVML library. It runs, in one process:

1. ``llmobs serve`` (a subprocess) in front of a tiny GPU "engine" served from here;
2. an idle phase: the collector's first readings (names, memory, the derived peak, GPM);
3. a copy phase: a large device-to-device copy in a loop, the copy's own bandwidth set against
   what the collector reads (GPM ``DRAM_BW_UTIL`` and the memory-controller ratio);
4. a decode phase: streaming clients through the sidecar to the engine, whose every decode step
   reads a weight matrix of known size once (a batched GEMV, memory-bound), so the true
   bandwidth utilization of a step is known and set against ``llmobs_mbu`` and GPM.

The figures go to stdout and, as JSON, to ``--out``. Run::

    python benchmarks/gpu_check.py --out /tmp/gpu_check.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

MODEL = "gpu-check"
HIDDEN = 8192  # GEMV width: the weight matrix is [rows, HIDDEN] bf16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_metrics(text: str, prefixes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every sample whose name starts with one of ``prefixes``, as name/labels/value."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefixes):
                out.append({"name": sample.name, "labels": sample.labels, "value": sample.value})
    return out


def pick(samples: list[dict[str, Any]], name: str, **labels: str) -> float | None:
    for s in samples:
        if s["name"] == name and all(s["labels"].get(k) == v for k, v in labels.items()):
            return float(s["value"])
    return None


def nvml_raw() -> dict[str, Any]:
    """What NVML itself says of GPU 0, read directly (to check the collector's derivations)."""
    import pynvml  # noqa: PLC0415 (only where a GPU is)

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        raw: dict[str, Any] = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "nvml": pynvml.nvmlSystemGetNVMLVersion(),
            "name": pynvml.nvmlDeviceGetName(h),
            "max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "bus_width_bits": pynvml.nvmlDeviceGetMemoryBusWidth(h),
            "gpm_supported": None,
            "mig_mode": None,
        }
        with contextlib.suppress(pynvml.NVMLError):
            raw["gpm_supported"] = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        with contextlib.suppress(pynvml.NVMLError):
            raw["mig_mode"] = pynvml.nvmlDeviceGetMigMode(h)[0]
        return raw
    finally:
        pynvml.nvmlShutdown()


class GpuEngine:
    """A continuous-batching decode loop whose step reads ``weight_bytes`` from device memory.

    Each step multiplies the weight matrix by one column per running stream (bf16), which for
    a batch far below the GEMM's arithmetic intensity threshold is bound by reading the
    weights: bytes per step = the weights' size, so true MBU = size / step time / peak.
    """

    def __init__(self, weight_gib: float, max_batch: int) -> None:
        import torch  # noqa: PLC0415 (only where a GPU is)

        self.torch = torch
        rows = int(weight_gib * (1 << 30)) // (HIDDEN * 2)
        self.weight = torch.randn(rows, HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.x = torch.randn(HIDDEN, max_batch, dtype=torch.bfloat16, device="cuda")
        self.weight_bytes = self.weight.numel() * 2
        self.queues: list[asyncio.Queue[str | None]] = []
        self.step_times: list[float] = []
        self.batch_sizes: list[int] = []
        self.max_batch = max_batch
        self._wake = asyncio.Event()

    def _step(self, batch: int) -> float:
        t = time.perf_counter()
        self.torch.matmul(self.weight, self.x[:, :batch])
        self.torch.cuda.synchronize()
        return time.perf_counter() - t

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.queues:
                self._wake.clear()
                await self._wake.wait()
            batch = self.queues[: self.max_batch]
            took = await loop.run_in_executor(None, self._step, len(batch))
            self.step_times.append(took)
            self.batch_sizes.append(len(batch))
            for q in batch:
                q.put_nowait("tok ")

    async def generate(self, tokens: int) -> AsyncIterator[str]:
        q: asyncio.Queue[str | None] = asyncio.Queue()
        self.queues.append(q)
        self._wake.set()
        try:
            for _ in range(tokens):
                item = await q.get()
                assert item is not None
                yield item
        finally:
            self.queues.remove(q)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = int(body.get("max_tokens", 128))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
        async for text in self.generate(tokens):
            chunk = {**head, "choices": [{"index": 0, "delta": {"content": text}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        done = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        usage = {
            **head,
            "choices": [],
            "usage": {"prompt_tokens": 16, "completion_tokens": tokens},
        }
        for event in (done, usage):
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def scrape(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with session.get(url) as r:
        text = await r.text()
    return parse_metrics(text, ("llmobs_gpu_", "llmobs_collector_", "llmobs_mbu"))


def copy_loop(stop: threading.Event, result: dict[str, float], gib: float) -> None:
    import torch  # noqa: PLC0415 (only where a GPU is)

    a = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    torch.cuda.synchronize()
    t, n = time.perf_counter(), 0
    while not stop.is_set():
        b.copy_(a)
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    result["copy_bytes_per_s"] = 2 * n * a.numel() / (time.perf_counter() - t)
    del a, b
    torch.cuda.empty_cache()


async def series(
    session: aiohttp.ClientSession, url: str, seconds: float
) -> list[list[dict[str, Any]]]:
    """Scrape once a second for ``seconds``; the first two scrapes are dropped (GPM warm-up)."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(1.0)
        out.append(await scrape(session, url))
    return out[2:]


def med(values: list[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def gpu_summary(scrapes: list[list[dict[str, Any]]]) -> dict[str, float | None]:
    names = {
        "gpm_bw_util": ("llmobs_gpu_memory_bandwidth_utilization", {"source": "gpm"}),
        "gpm_bw_bytes_per_s": ("llmobs_gpu_memory_bandwidth_bytes_per_second", {"source": "gpm"}),
        "mem_ctrl_util": ("llmobs_gpu_memory_controller_utilization", {}),
        "gpu_util": ("llmobs_gpu_utilization", {}),
        "power_w": ("llmobs_gpu_power_watts", {}),
        "sm_clock_hz": ("llmobs_gpu_clock_sm_hertz", {}),
        "mem_clock_hz": ("llmobs_gpu_clock_memory_hertz", {}),
        "temperature_c": ("llmobs_gpu_temperature_celsius", {}),
        "memory_used_bytes": ("llmobs_gpu_memory_used_bytes", {}),
        "mbu": ("llmobs_mbu", {"gen_ai_request_model": MODEL}),
    }
    return {
        key: med([pick(s, name, **labels) for s in scrapes])
        for key, (name, labels) in names.items()
    }


async def client(session: aiohttp.ClientSession, url: str, tokens: int, end: float) -> int:
    done = 0
    body = {"model": MODEL, "stream": True, "max_tokens": tokens, "messages": []}
    while time.monotonic() < end:
        async with session.post(url, json=body) as r:
            async for _ in r.content.iter_any():
                pass
        done += 1
    return done


async def main(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"nvml": nvml_raw()}
    engine = GpuEngine(args.weights_gib, args.streams)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    engine_port, port, metrics_port = free_port(), free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    engine_task = asyncio.get_running_loop().create_task(engine.run())
    # fmt: off
    command = [
        sys.executable, "-m", "llmobs", "serve",
        "--upstream", f"http://127.0.0.1:{engine_port}",
        "--host", "127.0.0.1", "--port", str(port),
        "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
        "--engine-scrape-interval", "0", "--gpu-sample-interval", "0.5",
        "--model-bytes", str(engine.weight_bytes), "--log-level", "info",
    ]
    # fmt: on
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sidecar = subprocess.Popen(command, env=env)  # noqa: ASYNC220 (started once, not awaited)
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(metrics) as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.0)
            idle = await scrape(session, metrics)
            report["idle_samples"] = idle
            report["idle"] = gpu_summary([idle])

            stop, copy_result = threading.Event(), {}
            thread = threading.Thread(target=copy_loop, args=(stop, copy_result, args.copy_gib))
            thread.start()
            copy_scrapes = await series(session, metrics, args.copy_seconds)
            stop.set()
            await asyncio.to_thread(thread.join)
            report["copy"] = {**gpu_summary(copy_scrapes), **copy_result}

            await asyncio.sleep(2.0)
            end = time.monotonic() + args.decode_seconds
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            clients = [
                asyncio.ensure_future(client(session, url, args.tokens, end))
                for _ in range(args.streams)
            ]
            decode_scrapes = await series(session, metrics, args.decode_seconds)
            requests = sum(await asyncio.gather(*clients))
            await asyncio.sleep(1.0)
            final = await scrape(session, metrics)
            steps = engine.step_times[len(engine.step_times) // 4 :]
            step = statistics.median(steps)
            peak = pick(idle, "llmobs_gpu_memory_bandwidth_peak_bytes_per_second")
            report["decode"] = {
                **gpu_summary(decode_scrapes),
                "mbu_final": pick(final, "llmobs_mbu", gen_ai_request_model=MODEL),
                "requests": requests,
                "streams": args.streams,
                "weight_bytes": engine.weight_bytes,
                "engine_step_s_median": step,
                "engine_steps": len(engine.step_times),
                "engine_batch_median": statistics.median(engine.batch_sizes),
                "true_step_bandwidth_bytes_per_s": engine.weight_bytes / step,
                "true_mbu_in_step": engine.weight_bytes / step / peak if peak else None,
            }
            report["peak_bytes_per_s"] = peak
    finally:
        sidecar.terminate()
        sidecar.wait(30)
        engine_task.cancel()
        await runner.cleanup()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--copy-gib", type=float, default=4.0)
    parser.add_argument("--copy-seconds", type=float, default=15.0)
    parser.add_argument("--weights-gib", type=float, default=16.0)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--decode-seconds", type=float, default=20.0)
    result = asyncio.run(main(parser.parse_args()))
    with open(parser.parse_args().out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    brief = {k: v for k, v in result.items() if k != "idle_samples"}
    print(json.dumps(brief, indent=2, default=str))
    for s in result["idle_samples"]:
        print(s["name"], s["labels"], s["value"])
