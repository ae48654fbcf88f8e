"""Realistic traffic: closed-loop streaming clients that measure what a user feels.

Used by ``llmobs demo``, the compose and Kubernetes ``load`` services and the tests: each
client sends streaming requests in the dialect the workload picks and records, on its own
clock, the time to the first output and every output chunk's arrival, counting tokens with the
same decoder and dialect the sidecar uses. The workload is a realistic, seeded mix of short
and long prompts, chat and completions. (The bench's load is ``llmobs.bench.stamped_load``:
one request shape, every chunk timed against the simulated engine's own send stamp.)
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from llmobs.observe.dialects import (
    OPENAI_CHAT,
    detect_stream,
    route_for_path,
)
from llmobs.observe.framing import Framing, NdjsonDecoder, SseDecoder
from llmobs.sim.dialects import DIALECTS as SIM_DIALECTS
from llmobs.sim.dialects import dialect_name

_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
          "seven", "wizards", "quietly", "hum")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Call:
    """One request to send: path and JSON body."""

    path: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Result:
    """What one client saw of one request (times in seconds from sending it)."""

    status: int
    ttft: float | None
    chunk_times: tuple[float, ...]
    tokens: int
    duration: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300


# the APIs the clients speak, by the names the sidecar gives them (``llmobs.dialect``)
DIALECTS = tuple(SIM_DIALECTS)
MIXED = "mixed"  # each in turn


class Workload:
    """A seeded mix: 80 % short prompts (~40-170 tokens), 20 % long (~400-1700).

    ``dialect`` picks the API the clients speak: ``openai`` (80 % chat, 20 % completions),
    ``ollama``, ``tgi``, ``anthropic``, ``openai-responses`` (earlier ``responses``),
    ``triton``, or ``mixed`` (each in turn).
    """

    def __init__(
        self, model: str, seed: int = 0, long_share: float = 0.2, dialect: str = OPENAI_CHAT.name
    ) -> None:
        dialect = dialect_name(dialect)
        if dialect not in (*DIALECTS, MIXED):
            raise ValueError(f"unknown dialect {dialect!r}")
        self._rng = random.Random(seed)
        self._model = model
        self._long_share = long_share
        self._dialect = dialect
        self._sent = 0

    def _text(self, tokens: int) -> str:
        words = [self._rng.choice(_WORDS) for _ in range(tokens)]  # ~4 chars + space per word
        return " ".join(words)

    def next(self) -> Call:
        rng = self._rng
        long = rng.random() < self._long_share
        prompt = self._text(rng.randint(300, 1200) if long else rng.randint(30, 120))
        max_tokens = rng.randint(32, 256)
        dialect = self._dialect
        if dialect == MIXED:
            dialect = DIALECTS[self._sent % len(DIALECTS)]
        self._sent += 1
        return _call(dialect, self._model, prompt, max_tokens, rng.random() < 0.8)


def _call(dialect: str, model: str, prompt: str, max_tokens: int, chat: bool) -> Call:
    """One streaming request in ``dialect``'s own shape (the sim's dialect knows it)."""
    path, body = SIM_DIALECTS[dialect].request(model, prompt, max_tokens, chat)
    return Call(path, body)


async def stream_call(session: aiohttp.ClientSession, base_url: str, call: Call) -> Result:
    """Send ``call`` and time its stream at the client, in whatever dialect it speaks."""
    clock = time.perf_counter
    start = clock()
    dialect = route_for_path(call.path).dialect()
    times: list[float] = []
    tokens = 0
    try:
        async with session.post(base_url + call.path, json=call.body) as resp:
            kind = detect_stream(resp.headers.get("Content-Type", ""))
            decoder: Framing = NdjsonDecoder() if kind == "ndjson" else SseDecoder()
            async for data in resp.content.iter_any():
                now = clock() - start
                got = sum(dialect.on_data(p) for p in decoder.payloads(data))
                if got:
                    times.append(now)
                    tokens += got
            status = resp.status
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return Result(0, None, tuple(times), tokens, clock() - start, type(exc).__name__)
    total = dialect.output_tokens if dialect.output_tokens is not None else tokens
    ttft = times[0] if times else None
    return Result(status, ttft, tuple(times), total, clock() - start)


async def run_load(
    base_url: str,
    workload: Workload,
    *,
    duration: float,
    concurrency: int,
    on_result: Callable[[Result], None],
    max_requests: int | None = None,
    tls: ssl.SSLContext | None = None,
) -> int:
    """Closed loop: ``concurrency`` clients send back to back for ``duration`` seconds
    (``tls``: how an https ``base_url`` is trusted; None: the system's trust store)."""
    deadline = time.perf_counter() + duration
    sent = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while time.perf_counter() < deadline and (max_requests is None or sent < max_requests):
            sent += 1
            on_result(await stream_call(session, base_url, workload.next()))

    connector = aiohttp.TCPConnector(limit=concurrency, ssl=tls if tls is not None else True)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return sent
