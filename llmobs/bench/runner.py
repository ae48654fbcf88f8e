"""The bench's plan: rounds x concurrency levels x targets, interleaved, then saturation.

Per round and concurrency level, a simulated engine on a fixed schedule (no prefill, one
token per stream every TPOT, every stream of the level in one batch, exact output lengths)
serves each target in turn, so the targets of a round see the same engine minutes apart,
not hours. Per cell: the target is started, warmed up (one request per stream, so connection
set-up is not measured), its idle RSS and CPU read, then the load runs for ``duration``
seconds (plus the drain of requests in flight), with /metrics scraped every
``scrape_interval`` on llmobs targets and the target's RSS sampled. Per round, an unpaced
engine then measures saturation (chunks/s, CPU per chunk and per request from two output
lengths) and the memory of ``open_streams`` idle open streams.

TPOT is stretched at high concurrency so that the paced cells never offer more than
``max_paced_rate`` chunks/s: on a small machine the engine and the client share the cores with
the target, and a saturated machine would measure its scheduler, not the target (saturation
is measured on its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llmobs.bench import procfs
from llmobs.bench.figures import cpu_split, latency, per_stream_kib, per_unit_us, scrape_effect
from llmobs.bench.stamped_load import (
    LoadSpec,
    one_request,
    open_streams,
    request_body,
    run_load,
    scrape_loop,
    session_for,
)
from llmobs.bench.targets import (
    START_TIMEOUT,
    TARGETS,
    Launcher,
    Started,
    affinity,
    log_tail,
    plan_pinning,
)

Progress = Callable[[str], None]
IDLE_FAULT = {"X-Sim-Fault": "headers-then-nothing"}
# What a scraper sends for each format: Prometheus 2.42's headers (the protobuf one with
# --enable-feature=native-histograms)
SCRAPE_ACCEPT = {
    "text": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "openmetrics": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "protobuf": "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
}


@dataclass(frozen=True)
class BenchOptions:
    """Everything ``llmobs bench`` can be told (see its --help)."""

    targets: tuple[str, ...] = TARGETS
    concurrency: tuple[int, ...] = (1, 16, 128, 512)
    rounds: int = 3
    tokens: int = 64
    prompt_tokens: int = 32
    tpot: float = 0.010
    max_paced_rate: float = 5000.0
    duration: float = 8.0
    arrival_rate: float | None = None
    scrape_interval: float = 1.0
    scrape_format: str = "text"  # text | openmetrics | protobuf: what the scrapes ask for
    saturation: bool = True
    saturation_streams: int = 64
    saturation_tokens: tuple[int, int] = (256, 16)
    saturation_duration: float = 4.0
    open_streams: int = 2000
    pin: bool = True
    nginx: str | None = None
    litellm: str | None = None
    llmobs_root: Path | None = None
    model: str = "sim-llama-3-8b"


@dataclass
class BenchResult:
    """Raw per-cell figures; ``report`` derives the added figures, ratios and medians."""

    machine: dict[str, Any]
    options: dict[str, Any]
    pinning: str
    skipped: dict[str, str] = field(default_factory=dict)
    cells: list[dict[str, Any]] = field(default_factory=list)
    saturation: list[dict[str, Any]] = field(default_factory=list)


def tpot_for(options: BenchOptions, concurrency: int) -> float:
    """The cell's decode interval: ``tpot``, stretched so N streams stay under the rate cap."""
    return max(options.tpot, concurrency / options.max_paced_rate)


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {
        "cpus": os.cpu_count(), "usable_cpus": cpus, "cpu_model": model,
        "kernel": platform.release(), "python": platform.python_version(),
        "machine": platform.machine(),
    }  # fmt: skip


async def _get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        return await resp.text()


async def engine_chunks(session: aiohttp.ClientSession, sim: Started) -> int:
    """Tokens the sim has generated so far (its ``vllm:generation_tokens_total``)."""
    assert sim.metrics_url is not None
    for line in (await _get_text(session, sim.metrics_url)).splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def wait_ready(session: aiohttp.ClientSession, started: Started, model: str) -> None:
    """Until a one-token stream goes through (or the process died, or time ran out)."""
    body = request_body(LoadSpec(started.url, 1, 0.0, 1, model=model))
    headers = {"Content-Type": "application/json"}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT
    while True:
        if started.proc is not None and started.proc.poll() is not None:
            raise RuntimeError(f"{started.name} exited at start:\n{log_tail(started)}")
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            s = await one_request(session, started.url + "/v1/chat/completions", body, headers,
                                  False)  # fmt: skip
            if s.ok:
                return
        if loop.time() > deadline:
            raise RuntimeError(f"{started.name} never answered:\n{log_tail(started)}")
        await asyncio.sleep(0.05)


async def _sample_rss(pids: list[int], peak: list[int]) -> None:
    while True:
        peak[0] = max(peak[0], procfs.rss_bytes(pids))
        await asyncio.sleep(0.25)


async def warm_up(session: aiohttp.ClientSession, url: str, streams: int, model: str) -> None:
    """One short request per stream at once: the pools hold a connection per stream after."""
    body = request_body(LoadSpec(url, streams, 0.0, 2, model=model))
    headers = {"Content-Type": "application/json"}
    path = url + "/v1/chat/completions"
    await asyncio.gather(*(one_request(session, path, body, headers, False)
                           for _ in range(streams)))  # fmt: skip


async def paced_cell(
    o: BenchOptions, launcher: Launcher, sim: Started, target: str, level: int, rnd: int
) -> dict[str, Any]:
    """One target at one concurrency level on the paced engine: latency, CPU, memory."""
    started = launcher.target(target, sim.url, o.model)
    try:
        async with session_for(level) as session, session_for(4) as admin:
            await wait_ready(admin, started, o.model)
            await warm_up(session, started.url, level, o.model)
            pids = procfs.tree(started.pid) if started.pid else []
            rss_idle, cpu0 = procfs.rss_bytes(pids), procfs.cpu_seconds(pids)
            times0 = procfs.cpu_times(pids)
            before = await engine_chunks(admin, sim)
            peak, windows = [rss_idle], list[tuple[int, int]]()
            tasks = [asyncio.ensure_future(_sample_rss(pids, peak))]
            if started.metrics_url and o.scrape_interval > 0:
                tasks.append(
                    asyncio.ensure_future(
                        scrape_loop(
                            admin,
                            started.metrics_url,
                            o.scrape_interval,
                            windows,
                            SCRAPE_ACCEPT[o.scrape_format],
                        )
                    )
                )
            spec = LoadSpec(started.url, level, o.duration, o.tokens, o.prompt_tokens, o.model,
                            o.arrival_rate)  # fmt: skip
            try:
                result = await run_load(spec, session)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            cpu = procfs.cpu_seconds(pids) - cpu0
            share = procfs.system_share(times0, procfs.cpu_times(pids))
            after = await engine_chunks(admin, sim)
    finally:
        launcher.stop(started)
    lat = latency(result.streams)
    scrape = scrape_effect(result.streams, windows) if windows else None
    return {
        "round": rnd, "target": target, "concurrency": level,
        "tpot_ms": tpot_for(o, level) * 1000, "wall_s": result.wall_s,
        **{f"{k}_ms" if k not in ("requests", "ok", "chunks") else k: v
           for k, v in asdict(lat).items()},
        "failed": lat.requests - lat.ok, "dropped": result.dropped,
        "engine_chunks": after - before, "chunks_match": lat.chunks == after - before,
        "chunks_per_s": lat.chunks / result.wall_s,
        "cpu_s": cpu if pids else math.nan,
        "cpu_us_per_chunk": per_unit_us(cpu, lat.chunks) if pids else math.nan,
        "cpu_us_per_request": per_unit_us(cpu, lat.requests) if pids else math.nan,
        "cpu_system_share": share if pids else math.nan,
        "cpu_user_us_per_chunk": per_unit_us(cpu * (1 - share), lat.chunks)
        if pids else math.nan,
        "rss_idle_mib": rss_idle / 2**20 if pids else math.nan,
        # below 16 streams the difference is the allocator's noise, not the streams
        "rss_per_active_stream_kib": per_stream_kib(peak[0], rss_idle, level)
        if pids and level >= 16 else math.nan,
        "scrape": asdict(scrape) if scrape else None,
    }  # fmt: skip


async def saturation_cell(
    o: BenchOptions, launcher: Launcher, sim: Started, target: str, rnd: int
) -> dict[str, Any]:
    """Unpaced engine: chunks/s, CPU per chunk and per request, memory per idle open stream."""
    started = launcher.target(target, sim.url, o.model)
    out: dict[str, Any] = {"round": rnd, "target": target, "streams": o.saturation_streams}
    runs: list[tuple[float, int, int]] = []
    try:
        async with session_for(o.saturation_streams) as session, session_for(4) as admin:
            await wait_ready(admin, started, o.model)
            await warm_up(session, started.url, o.saturation_streams, o.model)
            pids = procfs.tree(started.pid) if started.pid else []
            for tokens in o.saturation_tokens:
                cpu0, times0 = procfs.cpu_seconds(pids), procfs.cpu_times(pids)
                spec = LoadSpec(started.url, o.saturation_streams, o.saturation_duration, tokens,
                                o.prompt_tokens, o.model, record=False)  # fmt: skip
                result = await run_load(spec, session)
                cpu = procfs.cpu_seconds(pids) - cpu0
                share = procfs.system_share(times0, procfs.cpu_times(pids))
                runs.append((cpu, result.chunks, len(result.streams)))
                out[f"tokens_{tokens}"] = {
                    "chunks": result.chunks, "requests": len(result.streams),
                    "failed": sum(not s.ok for s in result.streams),
                    "chunks_per_s": result.chunks / result.wall_s,
                    "target_cpu_util": cpu / result.wall_s if pids else math.nan,
                    "cpu_us_per_chunk": per_unit_us(cpu, result.chunks) if pids else math.nan,
                    "cpu_system_share": share if pids else math.nan,
                    "cpu_user_us_per_chunk": per_unit_us(cpu * (1 - share), result.chunks)
                    if pids else math.nan,
                    "chunks_per_cpu_s": result.chunks / cpu if pids and cpu else math.nan,
                }  # fmt: skip
        per_chunk, per_request = cpu_split(runs) if pids else (math.nan, math.nan)
        out["fit_cpu_us_per_chunk"], out["fit_cpu_us_per_request"] = per_chunk, per_request
        out.update(await _open_streams(o, started, pids))
    finally:
        launcher.stop(started)
    return out


async def _open_streams(o: BenchOptions, started: Started, pids: list[int]) -> dict[str, Any]:
    """RSS with ``open_streams`` idle streams open through the target, against none."""
    if not pids or o.open_streams <= 0 or started.name == "litellm":
        # LiteLLM does not forward the X-Sim-Fault header that keeps a stream idle
        return {"open_streams": 0, "rss_per_open_stream_kib": math.nan}
    await asyncio.sleep(0.2)  # the saturation runs' last buffers freed
    idle = procfs.rss_bytes(pids)
    async with open_streams(started.url, o.open_streams, IDLE_FAULT) as opened:
        await asyncio.sleep(0.3)  # every stream has its headers: the target holds them all
        held = procfs.rss_bytes(pids)
    return {
        "open_streams": opened, "rss_idle_mib": idle / 2**20, "rss_open_mib": held / 2**20,
        "rss_per_open_stream_kib": per_stream_kib(held, idle, opened),
    }  # fmt: skip


def sim_flags(o: BenchOptions, tpot: float, batch: int, tokens: int) -> list[str]:
    """A fixed schedule: no prefill time, one token per stream per step, exact lengths."""
    return [
        "--model", o.model, "--max-batch", str(batch), "--prefill-base", "0",
        "--prefill-per-token", "0", "--decode-base", repr(tpot), "--decode-per-seq", "0",
        "--stall-every", "0", "--output-tokens-min", str(tokens),
        "--output-tokens-max", str(tokens), "--fault", "header",
    ]  # fmt: skip


async def start_sim(launcher: Launcher, flags: list[str], model: str) -> Started:
    sim = launcher.sim(flags)
    async with session_for(2) as session:
        await wait_ready(session, sim, model)
    return sim


async def run_bench(
    o: BenchOptions, workdir: Path | None = None, progress: Progress | None = None
) -> BenchResult:
    """Run every cell; every process started is stopped before this returns or raises."""
    say = progress or (lambda _: None)
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinning = plan_pinning(usable, o.pin and procfs.available())
    result = BenchResult(machine_info(), asdict(o), pinning.describe())
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmobs-bench")))
        workdir.mkdir(parents=True, exist_ok=True)
        launcher = Launcher(workdir, pinning, o.nginx, o.litellm, llmobs_root=o.llmobs_root)
        stack.callback(launcher.close)
        targets = []
        for t in o.targets:
            if why := launcher.unavailable(t):
                result.skipped[t] = why
                say(f"skipping {t}: {why}")
            else:
                targets.append(t)
        batch = max([*o.concurrency, o.saturation_streams, o.open_streams, 1])
        with affinity(pinning.client):
            for rnd in range(o.rounds):
                for level in o.concurrency:
                    tpot = tpot_for(o, level)
                    sim = await start_sim(launcher, sim_flags(o, tpot, batch, o.tokens), o.model)
                    try:
                        for target in targets:
                            cell = await paced_cell(o, launcher, sim, target, level, rnd)
                            result.cells.append(cell)
                            say(f"round {rnd} {target:12s} x{level:<4d} "
                                f"delay p50 {cell['delay_p50_ms']:.3f} ms, "
                                f"{cell['chunks_per_s']:.0f} chunks/s")  # fmt: skip
                    finally:
                        launcher.stop(sim)
                if o.saturation:
                    flags = sim_flags(o, 0.0, batch, max(o.saturation_tokens))
                    sim = await start_sim(launcher, flags, o.model)
                    try:
                        for target in targets:
                            sat = await saturation_cell(o, launcher, sim, target, rnd)
                            result.saturation.append(sat)
                            say(f"round {rnd} {target:12s} saturation done")
                    finally:
                        launcher.stop(sim)
    return result
