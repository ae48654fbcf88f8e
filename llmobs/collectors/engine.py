"""The engine collector: scrape the engine's own /metrics and re-export its queue and cache.

Every ``--engine-scrape-interval`` seconds it GETs ``--engine-metrics-url`` (the upstream's
``/metrics`` by default), recognises the engine from the metric names (``ENGINES``) and keeps
three numbers under uniform names with an ``engine`` label: requests waiting, requests
running, KV-cache usage (0-1). Counts are summed over the engine's label sets (models,
data-parallel ranks); the usage ratio is their mean.

Only lines that name a mapped metric are parsed (with ``prometheus_client``'s parser, one
line at a time, in a worker thread): an engine's exposition can be large, and a malformed
line costs only itself. An engine that is not up yet, or has no /metrics, or no known
metrics, leaves the collector down (logged once); the first scrape waits one interval, as
engines take a while to load their model.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from prometheus_client.parser import text_string_to_metric_families

from llmobs.collectors.base import PollingCollector, Unavailable
from llmobs.metrics import catalogue as m

MAX_BYTES = 16 * 1024**2  # a larger exposition is refused (an error)
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EngineSpec:
    """An engine's metric names for each uniform number; the first name present wins."""

    engine: str
    waiting: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.waiting, *self.running, *self.kv_usage)


ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec(
        "vllm",
        ("vllm:num_requests_waiting",),
        ("vllm:num_requests_running",),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # a 0-1 ratio despite "perc"
    ),
    EngineSpec(
        "sglang", ("sglang:num_queue_reqs",), ("sglang:num_running_reqs",), ("sglang:token_usage",)
    ),
    EngineSpec("tgi", ("tgi_queue_size",), ("tgi_batch_current_size",)),
    EngineSpec(
        "llamacpp",
        ("llamacpp:requests_deferred",),
        ("llamacpp:requests_processing",),
        ("llamacpp:kv_cache_usage_ratio",),
    ),
    EngineSpec(
        "trtllm",
        ("trtllm_num_requests_waiting", "trtllm:num_requests_waiting"),
        (),
        ("trtllm_kv_cache_utilization", "trtllm:kv_cache_utilization"),
    ),
)
_KNOWN = frozenset(name for spec in ENGINES for name in spec.names)


@dataclass(frozen=True)
class EngineReading:
    engine: str
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None


def _name(line: str) -> str:
    """The metric name a sample line starts with."""
    end = len(line)
    for sep in ("{", " ", "\t"):
        i = line.find(sep)
        if 0 <= i < end:
            end = i
    return line[:end]


def samples(text: str, names: frozenset[str] = _KNOWN) -> dict[str, list[float]]:
    """Values of the samples named in ``names``; malformed lines and NaNs are skipped."""
    out: dict[str, list[float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or _name(line) not in names:
            continue
        try:
            parsed = [s for f in text_string_to_metric_families(line + "\n") for s in f.samples]
        except (ValueError, IndexError, TypeError):
            continue
        for s in parsed:
            if s.name in names and not math.isnan(s.value):
                out.setdefault(s.name, []).append(float(s.value))
    return out


def read_engine(text: str) -> EngineReading | None:
    """The engine whose metrics ``text`` holds most of, and its three numbers; None if none."""
    found = samples(text)
    best = max(ENGINES, key=lambda spec: sum(name in found for name in spec.names))
    if not any(name in found for name in best.names):
        return None

    def first(names: tuple[str, ...]) -> list[float] | None:
        return next((found[n] for n in names if n in found), None)

    waiting, running, usage = first(best.waiting), first(best.running), first(best.kv_usage)
    return EngineReading(
        best.engine,
        sum(waiting) if waiting else None,
        sum(running) if running else None,
        sum(usage) / len(usage) if usage else None,
    )


class EngineCollector(PollingCollector[EngineReading]):
    """Scrapes ``url`` every ``interval`` seconds; ``snapshot`` holds the last reading."""

    def __init__(
        self,
        url: str,
        interval: float = 5.0,
        *,
        first_delay: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        # at start by default: a pod just started shows its engine at once (up, or down with
        # the reason) instead of absent for a whole interval
        delay = 0.0 if first_delay is None else first_delay
        super().__init__("engine", interval, first_delay=delay, clock=clock)
        self.url = url
        self._session: aiohttp.ClientSession | None = None

    async def poll(self) -> EngineReading:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=min(max(self.interval, 1.0), TIMEOUT_S))
        try:
            async with self._session.get(self.url, timeout=timeout) as resp:
                if resp.status != 200:
                    raise Unavailable(f"{self.url} answered {resp.status}")
                body = await _read_bounded(resp)
        except aiohttp.ClientConnectorError as exc:
            raise Unavailable(f"{self.url} unreachable ({type(exc).__name__})") from exc
        text = body.decode("utf-8", errors="replace")
        reading = await asyncio.to_thread(read_engine, text)
        if reading is None:
            raise Unavailable(f"no known engine metrics at {self.url}")
        return reading

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _read_bounded(resp: aiohttp.ClientResponse) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(65536):
        size += len(chunk)
        if size > MAX_BYTES:
            raise ValueError(f"engine metrics larger than {MAX_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


def register_engine(meter: Meter, collector: EngineCollector) -> None:
    """The three uniform engine gauges, reading the last snapshot."""

    def gauge(metric: m.MetricDef, value: Callable[[EngineReading], float | None]) -> None:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            reading = collector.snapshot
            v = value(reading) if reading is not None else None
            if reading is None or v is None:
                return []
            return [Observation(v, {m.ENGINE: reading.engine})]

        meter.create_observable_gauge(
            metric.name, [observe], unit=metric.unit, description=metric.description
        )

    gauge(m.ENGINE_WAITING, lambda r: r.waiting)
    gauge(m.ENGINE_RUNNING, lambda r: r.running)
    gauge(m.ENGINE_KV_CACHE, lambda r: r.kv_usage)
