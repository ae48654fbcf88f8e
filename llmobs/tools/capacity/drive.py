"""One load level driven through the sidecar, and the sidecar's /metrics read around it.

Concurrency: ``clients`` closed-loop clients send back to back; the first request of each
warms up (the burst of the start is not the steady state), the next ``measured`` are the
level's, and the requests sent after them only keep the load up until the last measured
one ends, when they are cancelled. Rate: requests arrive as a seeded Poisson process, the
first second's as warm-up. The sidecar's /metrics are read at the start and the end (its
counters' deltas) and every ``interval`` between (its gauges): parsed off the event loop,
so that reading them never delays a token the clients time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import resource
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmobs.export.metrics.catalogue import (
    ENGINE_KV_CACHE,
    ENGINE_PREEMPTIONS,
    ENGINE_RUNNING,
    ENGINE_WAITING,
    MBU,
    STALLS,
    TTFT,
    TTFT_PHASE,
)
from llmobs.tools.capacity.causes import Evidence
from llmobs.tools.capacity.figures import OVERLOADED, Sample
from llmobs.tools.capacity.workload import Workload, chat_body
from llmobs.tools.slo.samples import Sample as Metric
from llmobs.tools.slo.samples import page_samples
from llmobs.tools.traffic import Call, stream_call

CHAT_PATH = "/v1/chat/completions"
READ_TIMEOUT = 600.0  # seconds without a byte: a request failed, not a slow one
_PHASES, _STALLS = TTFT_PHASE.prometheus + "_sum", STALLS.prometheus
_PHASE_COUNTS = TTFT_PHASE.prometheus + "_count"
_TTFT_COUNT = TTFT.prometheus + "_count"
_PREEMPTIONS = ENGINE_PREEMPTIONS.prometheus
_GAUGES = {
    "waiting": ENGINE_WAITING.prometheus, "running": ENGINE_RUNNING.prometheus,
    "kv_usage": ENGINE_KV_CACHE.prometheus, "mbu": MBU.prometheus,
}  # fmt: skip
_COUNTERS = (_PHASES, _PHASE_COUNTS, _STALLS, _PREEMPTIONS, _TTFT_COUNT)
FAMILIES = frozenset({*_COUNTERS, *_GAUGES.values()})


@dataclass
class Target:
    """Where the load goes (the sidecar's proxy) and where its figures are read."""

    url: str
    model: str
    metrics_url: str = ""
    metrics_token: str = ""
    next_index: Callable[[], int] = field(default_factory=lambda: itertools.count().__next__)


async def read_metrics(session: aiohttp.ClientSession, target: Target) -> list[Metric]:
    """The sidecar's samples of the families read here (none when it cannot be read: a
    level is judged by its clients; the cause is then unknown)."""
    if not target.metrics_url:
        return []
    headers = {"Authorization": f"Bearer {target.metrics_token}"} if target.metrics_token else {}
    try:
        async with session.get(target.metrics_url, headers=headers) as resp:
            if resp.status != 200:
                return []
            text = await resp.text()
        samples, _ = await asyncio.to_thread(page_samples, text, FAMILIES)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return []
    return samples


def _sums(samples: list[Metric], name: str, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample_name, labels, value in samples:
        if sample_name == name and math.isfinite(value):
            part = labels.get(key, "")
            out[part] = out.get(part, 0.0) + value
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: max(0.0, v - before.get(k, 0.0)) for k, v in after.items()}


def _gauge(readings: list[list[Metric]], name: str, peak: bool) -> float | None:
    """A gauge over the readings (summed over its series in each): mean, or peak."""
    values = [sum(_sums(r, name, "").values()) for r in readings if _sums(r, name, "")]
    if not values:
        return None
    return max(values) if peak else sum(values) / len(values)


def _mean_phases(before: list[Metric], after: list[Metric]) -> dict[str, float]:
    """Each TTFT phase's mean over the requests the sidecar timed in the level (warm-up and
    the requests that kept the load up included: the same load)."""
    seconds = _delta(_sums(after, _PHASES, "phase"), _sums(before, _PHASES, "phase"))
    counts = _delta(_sums(after, _PHASE_COUNTS, "phase"), _sums(before, _PHASE_COUNTS, "phase"))
    return {phase: s / counts[phase] for phase, s in seconds.items() if counts.get(phase)}


def evidence(before: list[Metric], during: list[list[Metric]], after: list[Metric]) -> Evidence:
    """The level's ``Evidence`` from the readings of the sidecar around and during it."""
    readings = [*during, after]
    return Evidence(
        requests=sum(
            _delta(_sums(after, _TTFT_COUNT, ""), _sums(before, _TTFT_COUNT, "")).values()
        ),
        phases=_mean_phases(before, after),
        stalls=_delta(_sums(after, _STALLS, "cause"), _sums(before, _STALLS, "cause")),
        preemptions=sum(
            _delta(_sums(after, _PREEMPTIONS, ""), _sums(before, _PREEMPTIONS, "")).values()
        ),
        waiting=_gauge(readings, _GAUGES["waiting"], peak=False),
        running=_gauge(readings, _GAUGES["running"], peak=False),
        kv_usage=_gauge(readings, _GAUGES["kv_usage"], peak=True),
        mbu=_gauge(readings, _GAUGES["mbu"], peak=False),
    )


async def one(session: aiohttp.ClientSession, target: Target, workload: Workload) -> Sample:
    """Send the workload's next request and time it at the client."""
    index = target.next_index()
    shape = workload.shape(index)
    clock = time.perf_counter
    sent = clock()
    result = await stream_call(
        session, target.url, Call(CHAT_PATH, chat_body(target.model, shape, index))
    )
    error = result.error
    if error is None and not 200 <= result.status < 300:
        error = f"HTTP {result.status}"
    times = tuple(sent + t for t in result.chunk_times)
    return Sample(sent, sent + result.duration, result.ttft, times, result.tokens, error)


async def _until_measured(
    spawn: Callable[[], Coroutine[Any, Any, None]], done: asyncio.Event, drain: bool = False
) -> None:
    """Run ``spawn``'s load until ``done``, then cancel what is still in flight (``drain``:
    let it end, so that the sidecar counts no request the client left)."""
    task = asyncio.ensure_future(spawn())
    await done.wait()
    if drain:
        await task
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def closed_loop(
    session: aiohttp.ClientSession, target: Target, workload: Workload, clients: int,
    measured: int, drain: bool = False,
) -> list[Sample]:  # fmt: skip
    """``clients`` back-to-back clients: each one's first request warms up, the next
    ``measured`` of all of them are kept (``drain``: the requests sent meanwhile end
    before it returns, none is cancelled)."""
    kept: list[Sample] = []
    done = asyncio.Event()
    sent = itertools.count()

    async def client() -> None:
        while not done.is_set():
            number = next(sent)
            if drain and number >= clients + measured:
                return  # every request the level needs is sent: no more, none cut off
            sample = await one(session, target, workload)
            if clients <= number < clients + measured:
                kept.append(sample)
                if len(kept) == measured:
                    done.set()

    async def load() -> None:
        await asyncio.gather(*(client() for _ in range(clients)))

    await _until_measured(load, done, drain)
    return kept


async def open_loop(
    session: aiohttp.ClientSession, target: Target, workload: Workload, rate: float,
    measured: int, seed: int = 0, max_in_flight: int | None = None,
) -> list[Sample]:  # fmt: skip
    """Requests arriving at ``rate`` a second (Poisson, seeded): the first second's warm
    up, the next ``measured`` are kept; more than ``max_in_flight`` at once and the rest
    of the level counts as failed (the engine has fallen behind for good)."""
    rng = random.Random(f"arrivals:{seed}:{rate}")
    cap = max_in_flight if max_in_flight is not None else in_flight_cap()
    warm = math.ceil(rate)
    kept: list[Sample] = []
    done = asyncio.Event()
    in_flight: set[asyncio.Task[None]] = set()

    async def send(number: int) -> None:
        sample = await one(session, target, workload)
        if warm <= number < warm + measured:
            kept.append(sample)
            if len(kept) == measured:
                done.set()

    async def arrivals() -> None:
        try:
            for number in itertools.count():
                if len(in_flight) >= cap:
                    now = time.perf_counter()
                    kept.extend(Sample(now, now, None, (), 0, OVERLOADED)
                                for _ in range(measured - len(kept)))  # fmt: skip
                    done.set()
                    return
                task = asyncio.ensure_future(send(number))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                await asyncio.sleep(rng.expovariate(rate))
        finally:
            for task in list(in_flight):
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)

    await _until_measured(arrivals, done)
    return kept[:measured]


def in_flight_cap() -> int:
    """Requests a rate level may have open at once: what the open-files limit leaves room
    for (a connection each), 4096 at most; past it the engine has fallen behind for good."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(4096, soft - 64)) if soft != resource.RLIM_INFINITY else 4096


async def watched(
    target: Target, level: Coroutine[Any, Any, list[Sample]], interval: float = 1.0
) -> tuple[list[Sample], Evidence]:
    """Run ``level`` while reading the sidecar's /metrics: its samples and the evidence. The
    readings have a session of their own: never a connection a client waits for."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        before = await read_metrics(session, target)
        during: list[list[Metric]] = []

        async def watch() -> None:
            while True:
                await asyncio.sleep(interval)
                during.append(await read_metrics(session, target))

        watcher = asyncio.ensure_future(watch())
        try:
            samples = await level
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        after = await read_metrics(session, target)
    return samples, evidence(before, during, after)


class Unreachable(Exception):
    """Nothing answers at the URL the load is to go to (exit 2): the message says what."""


async def served_model(session: aiohttp.ClientSession, url: str) -> str | None:
    """The first model the engine lists at /v1/models (None: it lists none);
    ``Unreachable`` when nothing answers there at all."""
    try:
        async with session.get(url.rstrip("/") + "/v1/models") as resp:
            body: Any = await resp.json(content_type=None)
    except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
        raise Unreachable(f"nothing answers at {url} ({type(exc).__name__})") from None
    except (aiohttp.ClientError, ValueError):
        return None
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        return None


def connector_for(load: float, integer: bool) -> aiohttp.TCPConnector:
    """Connections for a level: one per client (a rate: no limit, keep-alive pooled)."""
    return aiohttp.TCPConnector(limit=int(load) if integer else 0)


def session_for(load: float, integer: bool) -> aiohttp.ClientSession:
    """A session for one level: no overall timeout (a queued request may wait long: that is
    what is measured), a connect that fails within ten seconds, and a request that hears
    nothing for ``READ_TIMEOUT`` fails (one stalled stream never holds a level forever)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=READ_TIMEOUT)
    return aiohttp.ClientSession(connector=connector_for(load, integer), timeout=timeout)
