"""The sim's scheduler: continuous batching with an exactly known timing model.

One background task plays the GPU. Each iteration is one engine step, as in vLLM without
chunked prefill:

* if requests wait and the batch has room, they are admitted and a PREFILL step runs, taking
  the sum over the admitted of ``prefill_base + prefill_per_token * prompt_tokens``; at its end
  every admitted request emits its first token;
* otherwise a DECODE step runs for the whole batch (with ``kv_capacity``, first preempting the
  latest admitted requests while the step would overfill the KV cache: they go back to the
  front of the queue and are recomputed, prompt and output, when there is room again, as vLLM
  does), taking ``decode_base + decode_per_seq *
  len(running)`` (plus ``stall_ms`` on every ``stall_every``-th decode step, counted over all
  requests); at its end every running request emits one token.

A decode leg of disaggregated prefill/decode (``SimSettings.pd_role``, ``pd``) first waits
``kv_transfer_base + kv_transfer_per_token * prompt_tokens`` out of the queue for its KV cache
(vLLM's WAITING_FOR_REMOTE_KVS), joins the queue when it has it, and its prefill computes only
its last prompt token.

Prefill blocks decode, so arrivals make running streams stutter: a realistic source of
inter-token variance whose size the tests can predict. The engine keeps the truth of every
such pause (``SimEngine.pauses``: when, how long, why, and which requests it held up), for
the tests of the sidecar's stall causes. Steps are scheduled on absolute deadlines
(``loop.time()``), so timer overshoot never accumulates into drift.

What a request produces is decided up front from the seed, so the text, the length and the
finish reason of a request are reproducible whatever the load; only the timing depends on it.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmobs.sim.config import SimSettings
from llmobs.sim.request import EOS_TOKEN, TOKENS, RequestState, SimRequest

# A loop blocked for longer than this re-bases the schedule on "now" instead of emitting a
# burst of overdue steps to catch up: a stalled host delays a GPU, it does not speed it up.
_MAX_LAG = 0.05


class PauseCause(enum.StrEnum):
    """Why the engine held its running requests' next token back (the truth, as it knows it)."""

    PREFILL = "prefill"  # other requests' prefill ran while these waited to decode
    ENGINE_PAUSE = "engine_pause"  # the periodic pause of every stream (``stall_every``)
    PREEMPTION = "preemption"  # preempted (the KV cache full), waiting, then recomputed


@dataclass(frozen=True)
class SimPause:
    """A stretch of the schedule (loop clock, seconds) in which ``seqs`` got no token."""

    start: float
    end: float
    cause: PauseCause
    seqs: tuple[int, ...]


MAX_PAUSES = 10_000  # the pauses kept (the latest): a long run's memory stays bounded


@dataclass
class SimCounters:
    """What the engine has counted, and its queue and batch sizes now: read by tests and by
    the /metrics collector (``SimEngine.counters``)."""

    requests_received: int = 0
    completed: int = 0
    cancelled: int = 0
    errors: int = 0
    waiting: int = 0
    running: int = 0
    transferring: int = 0  # decode legs pulling their KV cache, neither waiting nor running
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    preemptions: int = 0
    # vLLM's prefix cache (prompt tokens) and speculative decoding (draft tokens) counters
    prefix_queries: int = 0
    prefix_hits: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0
    # disaggregated prefill/decode: sequences that pulled their KV cache, prefill legs answered
    kv_transfers: int = 0
    prefill_legs: int = 0
    # seconds of the schedule spent in steps, prefill or decode: the GPU's busy time (its
    # rate is what nvidia-smi calls utilisation: any work at all, however small the batch)
    busy_seconds: float = 0.0
    # Headers of the last completion request, keys lower-cased (trace-context tests read it).
    last_headers: dict[str, str] = field(default_factory=dict)


def plan_output(
    settings: SimSettings,
    seq: int,
    max_tokens: int | None = None,
    seed: int | None = None,
    ignore_eos: bool = False,
    choice: int = 0,
    eos: bool = False,
) -> tuple[tuple[str, ...], str]:
    """The tokens and finish reason of a request: a pure function of seed and sequence number.

    A request's own ``seed`` replaces (settings seed, sequence number), as with a real sampler.
    ``ignore_eos`` (vLLM's benchmark switch) makes the output exactly ``max_tokens`` long.
    Choice ``i`` of an ``n > 1`` request is drawn independently: with a request seed from
    ``seed + i``, as vLLM seeds its child requests. With ``eos`` an output that stops ends with
    ``EOS_TOKEN``, which takes a decode step and counts against ``max_tokens`` like any token.
    """
    if seed is not None:
        key = f"request:{seed + choice}"
    else:
        key = f"{settings.seed}:{seq}" if choice == 0 else f"{settings.seed}:{seq}:{choice}"
    rng = random.Random(key)
    length = rng.randint(settings.output_tokens_min, settings.output_tokens_max)
    finish_reason = "stop"
    if max_tokens is not None and (ignore_eos or max_tokens < length + int(eos)):
        length, finish_reason = max_tokens, "length"
    tokens = tuple(rng.choices(TOKENS, k=length))
    if eos and finish_reason == "stop":
        tokens += (EOS_TOKEN,)
    return tokens, finish_reason


class SimEngine:
    """Waiting FIFO + running batch, driven by one background task (``start``/``stop``)."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.counters = SimCounters()
        self._waiting: collections.deque[SimRequest] = collections.deque()
        # Keyed by the request itself: the choices of an ``n > 1`` request share one ``seq``.
        self._running: dict[SimRequest, None] = {}
        # decode legs pulling their KV cache, each with the timer that queues it when done
        self._transferring: dict[SimRequest, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._seq = 0
        self.pauses: collections.deque[SimPause] = collections.deque(maxlen=MAX_PAUSES)
        # the sequence number of each request that named itself (X-Request-Id), the latest
        self.seqs: collections.OrderedDict[str, int] = collections.OrderedDict()
        # the prompts seen (a digest each), the latest: the sim's prefix cache
        self._prompts: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        # the prefill step running: when it ends, and whether a prompt in it has had no token
        self._step_end: float | None = None
        self._step_first = False

    def receive(self, headers: Mapping[str, str]) -> int:
        """Count an incoming completion request and give it its sequence number."""
        self.counters.requests_received += 1
        self.counters.last_headers = {k.lower(): v for k, v in headers.items()}
        seq = self._seq
        self._seq += 1
        request_id = self.counters.last_headers.get("x-request-id")
        if request_id is not None:
            self.seqs[request_id] = seq
            if len(self.seqs) > MAX_PAUSES:
                self.seqs.popitem(last=False)
        return seq

    def look_up_prefix(self, body: bytes, prompt_tokens: int) -> None:
        """The sim's prefix cache, counted as vLLM counts its own: a request whose body was
        seen before finds its whole prompt cached, any other none of it."""
        digest = hashlib.blake2b(body, digest_size=16).digest()
        self.counters.prefix_queries += prompt_tokens
        if digest in self._prompts:
            self.counters.prefix_hits += prompt_tokens
            self._prompts.move_to_end(digest)
            return
        self._prompts[digest] = None
        if len(self._prompts) > MAX_PAUSES:
            self._prompts.popitem(last=False)

    def injects_error(self, seq: int) -> bool:
        """Whether request ``seq`` is answered with an injected 500 (deterministic)."""
        rate = self.settings.error_rate
        return rate > 0 and random.Random(f"{self.settings.seed}:error:{seq}").random() < rate

    def record_error(self) -> None:
        """Count a request answered with an error status."""
        self.counters.errors += 1

    def record_prefill_leg(self) -> None:
        """Count a prefill leg answered with the params a decode engine pulls its KV by."""
        self.counters.prefill_legs += 1

    def submit(
        self,
        seq: int,
        prompt_tokens: int,
        max_tokens: int | None = None,
        seed: int | None = None,
        ignore_eos: bool = False,
        choice: int = 0,
        eos: bool = False,
        decode_leg: bool = False,
    ) -> SimRequest:
        """Queue a sequence for prefill; its tokens arrive through ``next_token``.

        An ``n > 1`` request submits one sequence per choice, each taking its own place in the
        batch and its own prefill, as vLLM fans such a request out into child requests. A
        ``decode_leg`` first pulls its KV cache from the prefill engine, out of the queue.
        """
        tokens, finish_reason = plan_output(
            self.settings, seq, max_tokens, seed, ignore_eos, choice, eos
        )
        request = SimRequest(seq, prompt_tokens, tokens, finish_reason)
        loop = asyncio.get_running_loop()
        request.submitted_at = loop.time()  # its arrival, before any transfer
        self.counters.prompt_tokens += prompt_tokens
        if decode_leg:
            self._transfer(loop, request)
        else:
            self._queue(request, request.submitted_at)
        return request

    def _queue(self, request: SimRequest, at: float) -> None:
        request.state = RequestState.WAITING
        request.queued_at = at
        self._waiting.append(request)
        self._sync_counts()
        self._wake.set()

    def _transfer(self, loop: asyncio.AbstractEventLoop, request: SimRequest) -> None:
        """Start a decode leg's KV pull; it joins the queue when the pull is done (on the
        schedule's clock, however late the timer), holding no place in the batch meanwhile."""
        s = self.settings
        request.decode_leg = True
        request.state = RequestState.TRANSFERRING
        request.transfer_s = s.kv_transfer_base + s.kv_transfer_per_token * request.prompt_tokens
        done = request.submitted_at + request.transfer_s
        self._transferring[request] = loop.call_at(done, self._pulled, request, done)
        self._sync_counts()

    def _pulled(self, request: SimRequest, done: float) -> None:
        del self._transferring[request]
        self.counters.kv_transfers += 1
        self._queue(request, done)

    def cancel(self, request: SimRequest) -> None:
        """Drop an unfinished request at once (its client is gone); no-op once finished."""
        if request.state is RequestState.TRANSFERRING:
            self._transferring.pop(request).cancel()
        elif request.state is RequestState.WAITING:
            self._waiting.remove(request)
        elif request.state is RequestState.RUNNING:
            del self._running[request]
        else:
            return
        request.state = RequestState.CANCELLED
        self.counters.cancelled += 1
        self._sync_counts()

    def prefill_backlog(self, now: float) -> float:
        """The truth the sidecar's prefill backlog estimates: the seconds of prefill the
        prompts waiting for their first token will take from ``now`` (loop clock): the
        rest of the running prefill step if one of them is in it, and the prefill of each
        waiting one (a preempted request, which has had tokens, is not waiting for a first)."""
        s = self.settings
        left = max(0.0, self._step_end - now) if self._step_end and self._step_first else 0.0
        for r in self._waiting:
            if r.generated == 0:
                left += s.prefill_base + s.prefill_per_token * r.prefill_tokens
        return left

    def _held_tokens(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self._running)

    def kv_cache_usage(self) -> float:
        """Simulated KV-cache fill: tokens held by the batch over its capacity (the nominal
        one, max batch x longest output, when ``kv_capacity`` sets none)."""
        s = self.settings
        capacity = s.kv_capacity or s.max_batch * s.output_tokens_max
        return min(1.0, self._held_tokens() / capacity)

    def _admits(self, request: SimRequest, held: int) -> bool:
        """Whether the batch has room for ``request`` (its prompt, what it generated, and
        its next token): a place, and with ``kv_capacity`` the KV cache."""
        s = self.settings
        if len(self._running) >= s.max_batch:
            return False
        if not s.kv_capacity or not self._running:  # alone, it runs whatever its size
            return True
        return held + request.prompt_tokens + request.generated + 1 <= s.kv_capacity

    def _preempt(self, clock: float) -> None:
        """The next decode step would overfill the KV cache: preempt the latest admitted
        requests (vLLM's policy) back to the front of the queue, to be recomputed."""
        capacity = self.settings.kv_capacity
        if not capacity:
            return
        held = self._held_tokens()
        while len(self._running) > 1 and held + len(self._running) > capacity:
            request = next(reversed(self._running))
            del self._running[request]
            held -= request.prompt_tokens + request.generated
            request.state = RequestState.WAITING
            request.preempted_at = request.last_token_at
            self._waiting.appendleft(request)
            self.counters.preemptions += 1
        self._sync_counts()

    def start(self) -> None:
        """Start the scheduling loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Stop the loop; unfinished requests fail with ``EngineStopped``."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._abort_all()  # also when the loop never ran (a task cancelled before its start)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time()  # when the previous step ended: the next one starts then
        try:
            while True:
                if not self._waiting and not self._running:
                    self._wake.clear()
                    await self._wake.wait()
                    clock = loop.time()
                elif loop.time() - clock > _MAX_LAG:
                    clock = loop.time()
                if self._waiting and self._admits(self._waiting[0], self._held_tokens()):
                    clock = await self._prefill(loop, clock)
                else:
                    self._preempt(clock)
                    clock = await self._decode(loop, clock)
        finally:
            self._abort_all()

    def _admit(self) -> list[SimRequest]:
        """Move the requests the batch has room for from the queue into it."""
        admitted: list[SimRequest] = []
        tokens = self._held_tokens()
        while self._waiting and self._admits(self._waiting[0], tokens):
            request = self._waiting.popleft()
            request.state = RequestState.RUNNING
            self._running[request] = None
            admitted.append(request)
            tokens += request.prompt_tokens + request.generated
        self._sync_counts()
        return admitted

    async def _prefill(self, loop: asyncio.AbstractEventLoop, clock: float) -> float:
        s = self.settings
        held = tuple(r.seq for r in self._running)  # decoding, and waiting for this prefill
        admitted = self._admit()
        # not before its requests joined the queue (a transfer's end may be later than the
        # step that let the engine see it)
        clock = max([clock, *(r.queued_at for r in admitted)])
        started = clock
        for request in admitted:
            if request.preempted_at is None:
                request.prefill_started_at = clock
        self.counters.prefill_steps += 1
        # a preempted request is recomputed (its prompt and what it had generated), a decode
        # leg's first prefill is its last prompt token
        clock += sum(s.prefill_base + s.prefill_per_token * r.prefill_tokens for r in admitted)
        self.counters.busy_seconds += clock - started
        if held:
            self.pauses.append(SimPause(started, clock, PauseCause.PREFILL, held))
        self._step_end, self._step_first = clock, any(r.generated == 0 for r in admitted)
        try:
            await asyncio.sleep(max(0.0, clock - loop.time()))
        finally:
            self._step_end = None
        for request in admitted:
            if request.state is RequestState.RUNNING:  # not cancelled meanwhile
                self._emit(request, clock)
        return clock

    async def _decode(self, loop: asyncio.AbstractEventLoop, clock: float) -> float:
        s = self.settings
        self.counters.decode_steps += 1
        step = s.decode_base + s.decode_per_seq * len(self._running)
        clock += step
        self.counters.busy_seconds += step
        if s.stall_every > 0 and self.counters.decode_steps % s.stall_every == 0:
            pause = s.stall_ms / 1000.0
            held = tuple(r.seq for r in self._running)
            self.pauses.append(SimPause(clock, clock + pause, PauseCause.ENGINE_PAUSE, held))
            clock += pause
        if s.spec_tokens:  # each request's drafts, and the share of them accepted
            self.counters.spec_drafted += s.spec_tokens * len(self._running)
            self.counters.spec_accepted += int(s.spec_tokens * s.spec_acceptance) * len(
                self._running
            )
        await asyncio.sleep(max(0.0, clock - loop.time()))
        # Only requests admitted before this step are in the batch: admission happens in this
        # loop alone, and cancelled ones have already been removed.
        for request in list(self._running):
            self._emit(request, clock)
        return clock

    def _emit(self, request: SimRequest, clock: float) -> None:
        if request.generated == 0:
            request.first_token_at = clock
        elif request.preempted_at is not None:  # resumed: its wait was the preemption's
            pause = SimPause(request.preempted_at, clock, PauseCause.PREEMPTION, (request.seq,))
            self.pauses.append(pause)
            request.preempted_at = None
        request.last_token_at = clock
        request.emit(request.tokens[request.generated])
        request.generated += 1
        self.counters.generation_tokens += 1
        if request.generated == len(request.tokens):
            request.state = RequestState.DONE
            del self._running[request]
            self.counters.completed += 1
            self._sync_counts()

    def _abort_all(self) -> None:
        for timer in self._transferring.values():
            timer.cancel()
        for request in [*self._transferring, *self._waiting, *self._running]:
            request.state = RequestState.CANCELLED
            request.stop()
        self._transferring.clear()
        self._waiting.clear()
        self._running.clear()
        self._sync_counts()

    def _sync_counts(self) -> None:
        self.counters.waiting = len(self._waiting)
        self.counters.running = len(self._running)
        self.counters.transferring = len(self._transferring)
