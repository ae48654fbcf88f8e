"""The bench's load: N streaming chat requests at once, each chunk's arrival recorded against
the send stamp the simulated engine wrote into it. (``llmobs.tools.traffic`` is the other
load: realistic traffic in every dialect for the demo and the deployments, timed as a user
feels it, with no stamps.)

It shares the machine with what it measures, so it does as little as it can per chunk: no
JSON, no SSE decoder. A read is split at its last blank line (an event boundary; the rest is
kept for the next read) and the stamps the simulated engine puts at the end of each token's
text (``" lorem llmobs_sent_ns=N"``, see ``llmobs.sim.dialects.base.stamp_event``) are found
with ``bytes.find``. Every stamped event gets the arrival time of the read that completed it,
``time.monotonic_ns()`` (CLOCK_MONOTONIC, the engine's clock too), so arrival minus stamp is
the delivery delay of that chunk through whatever sits between engine and client.

Closed loop by default (each of ``concurrency`` streams sends its next request when the last
one ends); with ``arrival_rate`` an open loop (Poisson arrivals, at most ``concurrency`` in
flight; arrivals past that are counted as dropped). Requests issued before the deadline are
drained, so every chunk the engine sent is accounted for.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import time
from array import array
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmobs.sim.dialects.base import RECEIVED_MARK, SENT_MARK

SENT_KEY = SENT_MARK.encode()
RECEIVED_KEY = RECEIVED_MARK.encode()
DONE = b"data: [DONE]"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One cell's load: where, how many streams, how long, how big each request is."""

    url: str
    concurrency: int
    duration: float
    tokens: int
    prompt_tokens: int = 32
    model: str = "sim-llama-3-8b"
    arrival_rate: float | None = None  # requests/s (open loop); None: closed loop
    headers: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    record: bool = True  # False: count chunks only (saturation runs)


@dataclass(slots=True)
class Stream:
    """What the client saw of one request; times are CLOCK_MONOTONIC nanoseconds."""

    send_ns: int
    status: int = 0
    received_ns: int = 0  # when the engine had the request (its stamp; 0: none)
    chunks: int = 0  # stamped events received
    sent: array[int] = field(default_factory=lambda: array("q"))  # engine's send stamps
    arrivals: array[int] = field(default_factory=lambda: array("q"))  # client arrival times
    done: bool = False  # ``data: [DONE]`` seen
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.done


@dataclass(slots=True)
class LoadResult:
    """Every request of a cell, and the cell's own start and end (drain included)."""

    streams: list[Stream]
    started_ns: int
    ended_ns: int
    dropped: int = 0  # open loop: arrivals with ``concurrency`` already in flight

    @property
    def chunks(self) -> int:
        return sum(s.chunks for s in self.streams)

    @property
    def wall_s(self) -> float:
        return (self.ended_ns - self.started_ns) / 1e9


def request_body(spec: LoadSpec) -> bytes:
    """A chat request for exactly ``tokens`` tokens (``ignore_eos``), prompt of ~N tokens."""
    prompt = "word" * spec.prompt_tokens  # the sim counts four characters per token
    return json.dumps({
        "model": spec.model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": spec.tokens, "ignore_eos": True, "stream": True,
    }).encode()  # fmt: skip


def parse_events(block: bytes, stream: Stream, now: int, record: bool) -> None:
    """Record the stamped events of ``block`` (whole events only) as arriving at ``now``."""
    pos = block.find(SENT_KEY)
    if pos < 0:
        return
    if stream.chunks == 0 and (r := block.find(RECEIVED_KEY)) >= 0:
        start = r + len(RECEIVED_KEY)
        stream.received_ns = int(block[start : block.find(b" ", start)])
    while pos >= 0:
        start = pos + len(SENT_KEY)
        end = block.find(b'"', start)  # the stamp ends its JSON string
        stream.chunks += 1
        if record:
            stream.sent.append(int(block[start:end]))
            stream.arrivals.append(now)
        pos = block.find(SENT_KEY, end)


async def one_request(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str],
    record: bool,
) -> Stream:  # fmt: skip
    """Send one streaming request and record every stamped chunk as it arrives."""
    clock = time.monotonic_ns
    stream = Stream(clock())
    tail = b""
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            stream.status = resp.status
            async for data in resp.content.iter_any():
                now = clock()
                buf = tail + data if tail else data
                cut = buf.rfind(b"\n\n")
                if cut < 0:
                    tail = buf
                    continue
                tail = buf[cut + 2 :]
                parse_events(buf[:cut], stream, now, record)
                if not stream.done and buf.find(DONE, max(0, cut - 16)) >= 0:
                    stream.done = True
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        stream.error = type(exc).__name__
    return stream


def session_for(concurrency: int) -> aiohttp.ClientSession:
    """A pooled session with one connection per stream and no overall timeout."""
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


class _Cell:
    """One cell's requests under way: the streams so far, the deadline, the arrivals dropped."""

    def __init__(self, spec: LoadSpec, session: aiohttp.ClientSession) -> None:
        self.spec = spec
        self._session = session
        self._url = spec.url + CHAT_PATH
        self._body = request_body(spec)
        self._headers = {"Content-Type": "application/json", **spec.headers}
        self.streams: list[Stream] = []
        self.dropped = 0
        self.started = time.monotonic_ns()
        self._deadline = self.started + int(spec.duration * 1e9)

    def _one(self) -> Coroutine[Any, Any, Stream]:
        return one_request(self._session, self._url, self._body, self._headers, self.spec.record)

    async def run(self) -> None:
        """The closed loop, or with ``arrival_rate`` the open one; drained before it returns."""
        if self.spec.arrival_rate:
            await self._open_loop(self.spec.arrival_rate)
        else:
            await asyncio.gather(*(self._closed_loop() for _ in range(self.spec.concurrency)))

    async def _closed_loop(self) -> None:
        while time.monotonic_ns() < self._deadline:
            self.streams.append(await self._one())

    async def _open_loop(self, rate: float) -> None:
        rng = random.Random(self.spec.seed)
        in_flight: set[asyncio.Task[Stream]] = set()

        def finished(task: asyncio.Task[Stream]) -> None:
            in_flight.discard(task)
            self.streams.append(task.result())

        next_at = self.started / 1e9
        while (now := time.monotonic_ns()) < self._deadline:
            next_at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, next_at - now / 1e9))
            if len(in_flight) >= self.spec.concurrency:
                self.dropped += 1
                continue
            task = asyncio.ensure_future(self._one())
            in_flight.add(task)
            task.add_done_callback(finished)
        while in_flight:
            await asyncio.gather(*list(in_flight))


async def run_load(spec: LoadSpec, session: aiohttp.ClientSession | None = None) -> LoadResult:
    """Drive one cell; requests issued before ``duration`` ends are drained, then it returns."""
    own = session is None
    session = session or session_for(spec.concurrency)
    cell = _Cell(spec, session)
    # No garbage collection while the cell runs: a full collection of this process's heap
    # (aiohttp, numpy, the rounds so far) stalls its loop on a small machine, and every chunk
    # in flight would arrive that much "late", charged to the target (docs/benchmarks.md).
    # What the cell leaves in cycles is collected after it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        await cell.run()
        ended = time.monotonic_ns()
    finally:
        if collecting:
            gc.enable()
        if own:
            await session.close()
    return LoadResult(cell.streams, cell.started, ended, cell.dropped)


async def scrape_loop(
    session: aiohttp.ClientSession,
    url: str,
    interval: float,
    windows: list[tuple[int, int]],
    accept: str = "text/plain;version=0.0.4",
) -> None:
    """GET ``url`` (asking for ``accept``) every ``interval`` s until cancelled; record each
    scrape's (start, end) ns."""
    while True:
        await asyncio.sleep(interval)
        start = time.monotonic_ns()
        try:
            async with session.get(url, headers={"Accept": accept}) as resp:
                await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            continue
        windows.append((start, time.monotonic_ns()))


@contextlib.asynccontextmanager
async def open_streams(
    url: str, count: int, headers: Mapping[str, str], tokens: int = 16
) -> AsyncIterator[int]:
    """Hold ``count`` streaming requests open (headers received, no body yet) while inside.

    Meant for a sim started with ``--fault header``: ``X-Sim-Fault: headers-then-nothing``
    makes each answer 200 with its headers, then nothing, so every stream stays open and idle
    at every hop. Yields how many streams did get their headers; closes them all on exit.
    """
    session = session_for(count)
    body = request_body(LoadSpec(url, count, 0.0, tokens))
    all_headers = {"Content-Type": "application/json", **headers}
    responses: list[aiohttp.ClientResponse] = []

    async def one() -> None:
        resp = await session.post(url + CHAT_PATH, data=body, headers=all_headers)
        responses.append(resp)

    try:
        results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
        del results
        yield sum(1 for r in responses if r.status == 200)
    finally:
        for resp in responses:
            resp.close()
        await session.close()
