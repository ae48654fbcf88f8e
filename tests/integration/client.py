"""A user's client: the real OpenAI SDK, in a process of its own, timing streams on its clock.

In its own process because in the test's process the client would share one event loop with
the sidecar: four concurrent requests being built by the SDK would delay the sidecar's reading
of them (by ~6 ms here), an artefact no deployment has. Connections are opened before timing
starts (a new connection costs the client 15-20 ms of its own here, after the request left the
SDK and before any server can see it). ``time.perf_counter`` is the
system-wide monotonic clock on Linux, so times compare across the two processes, though only
durations are compared. Everything here is picklable for ``ProcessPoolExecutor`` (spawn).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from openai import AsyncOpenAI, DefaultAsyncHttpxClient

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SEED = 0
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One greedy request: chat (``text`` is the user message) or completions (the prompt)."""

    path: str
    text: str
    max_tokens: int
    model: str


@dataclass(frozen=True)
class Seen:
    """One stream at the client: the response id; when the request went out (perf_counter,
    when the SDK handed it to its HTTP transport, on a connection already open); each output
    event's arrival in seconds from then (one event is one token with llama.cpp); and ``prep``,
    the SDK's time from the call to sending (building and validating the request), which no
    server can see."""

    id: str
    sent: float
    times: tuple[float, ...]
    prep: float

    @property
    def ttft(self) -> float:
        return self.times[0]

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


def streams(
    base_url: str, calls: Sequence[Call], concurrently: bool = False, warm_up: str = ""
) -> list[Seen]:
    """Stream ``calls`` (one after another, or all at once).

    The SDK's first request of a kind in a process takes ~25 ms more to build (its models are
    compiled on first use): the process's first call also sends one of each, of one token, to
    ``warm_up`` (the engine itself, so that the sidecar does not count them).
    """
    return _run(_streams(base_url, calls, concurrently, warm_up))


def completion_tokens(base_url: str, call: Call) -> int:
    """``usage.completion_tokens`` of ``call`` sent without streaming."""
    return _run(_completion_tokens(base_url, call))


def _run(work: Coroutine[object, object, T]) -> T:
    """Run ``work``; a failure comes back to the test as a ``RuntimeError`` naming it. The
    SDK's own errors do not survive pickling: one would break the process pool, and with it
    every later test of the module, instead of failing its own."""
    try:
        return asyncio.run(work)
    except Exception as exc:
        raise RuntimeError(f"the client failed: {exc!r}") from None


# When the SDK hands the current task's request to its transport (``stream`` sets the list).
_SENT: ContextVar[list[float]] = ContextVar("sent")


async def _on_send(request: object) -> None:
    if (sent := _SENT.get(None)) is not None:
        sent.append(time.perf_counter())


def _client(base_url: str) -> AsyncOpenAI:
    http = DefaultAsyncHttpxClient(event_hooks={"request": [_on_send]})
    return AsyncOpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, http_client=http)


_warm: set[str] = set()  # the process's SDK has sent a request of each kind there


async def _streams(
    base_url: str, calls: Sequence[Call], concurrently: bool, warm_up: str
) -> list[Seen]:
    if warm_up and warm_up not in _warm:
        # one connection each: the setup never waits on a keep-alive the engine just closed
        # (a clean clone's CI once saw the SDK's "Connection error." here or in the next step)
        for path in (CHAT, COMPLETIONS):
            async with _client(warm_up) as engine:
                await stream(engine, Call(path, "Hello", 1, "warm-up"))
        _warm.add(warm_up)
    async with _client(base_url) as client:
        # connected, as many connections as requests at once: timing starts warm (opening
        # them may be retried: it is setup; the streams measured never are)
        connections = len(calls) if concurrently else 1
        opening = client.with_options(max_retries=2)
        await asyncio.gather(*(opening.models.list() for _ in range(connections)))
        if concurrently:
            return list(await asyncio.gather(*(stream(client, c) for c in calls)))
        return [await stream(client, c) for c in calls]


async def stream(client: AsyncOpenAI, call: Call) -> Seen:
    """Stream one greedy request and time its output events."""
    times: list[float] = []
    response_id = ""
    sent: list[float] = []
    _SENT.set(sent)
    called = time.perf_counter()
    if call.path == CHAT:
        chat = await client.chat.completions.create(
            model=call.model, messages=[{"role": "user", "content": call.text}],
            max_tokens=call.max_tokens, temperature=0, seed=SEED, stream=True,
        )  # fmt: skip
        async with chat:
            async for chunk in chat:
                response_id = chunk.id
                if chunk.choices and chunk.choices[0].delta.content:
                    times.append(time.perf_counter())
    else:
        completion = await client.completions.create(
            model=call.model, prompt=call.text, max_tokens=call.max_tokens, temperature=0,
            seed=SEED, stream=True,
        )  # fmt: skip
        async with completion:
            async for piece in completion:
                response_id = piece.id
                if piece.choices and piece.choices[0].text:
                    times.append(time.perf_counter())
    assert times, f"no output from {call}"
    (start,) = sent
    return Seen(response_id, start, tuple(t - start for t in times), start - called)


async def _completion_tokens(base_url: str, call: Call) -> int:
    async with _client(base_url) as client:
        if call.path == CHAT:
            chat = await client.chat.completions.create(
                model=call.model, messages=[{"role": "user", "content": call.text}],
                max_tokens=call.max_tokens, temperature=0, seed=SEED,
            )  # fmt: skip
            usage = chat.usage
        else:
            completion = await client.completions.create(
                model=call.model, prompt=call.text, max_tokens=call.max_tokens, temperature=0,
                seed=SEED,
            )  # fmt: skip
            usage = completion.usage
    assert usage is not None
    return usage.completion_tokens
