"""A sequence inside the simulated engine, and the vocabulary its tokens come from.

Apart from the engine (``engine``) because the dialects and the faults render and cancel such
sequences without driving one: they import this module, which imports nothing of the sim.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

_LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco "
    "laboris nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate "
    "velit esse cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident "
    "sunt culpa qui officia deserunt mollit anim id est laborum"
)
TOKENS = tuple(" " + word for word in _LOREM.split())
# The end-of-sequence token, for dialects that stream it (TGI): Llama-2's text and id.
EOS_TOKEN = "</s>"
EOS_TOKEN_ID = 2
# Word ids start past the special tokens, as in a real vocabulary.
_TOKEN_IDS = {text: 100 + i for i, text in enumerate(TOKENS)} | {EOS_TOKEN: EOS_TOKEN_ID}


class EngineStopped(Exception):
    """The engine shut down before the request finished."""


class RequestState(enum.Enum):
    """Where a sequence is: pulling its KV cache (a decode leg, out of the queue: vLLM's
    WAITING_FOR_REMOTE_KVS), queued, in the batch, finished, or dropped (its client gone)."""

    TRANSFERRING = "transferring"
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


def token_id(text: str) -> int:
    """The vocabulary id of a token the sim produces (dialects that send ids need one)."""
    return _TOKEN_IDS[text]


@dataclass(eq=False)
class SimRequest:
    """One sequence inside the engine; the HTTP handler awaits its tokens.

    The ``*_at`` fields are the schedule's own deadlines on the loop clock (not when the
    handler woke up), so that dialects reporting durations (Ollama) report the timing model.
    """

    seq: int
    prompt_tokens: int
    tokens: tuple[str, ...]
    finish_reason: str
    generated: int = 0
    state: RequestState = RequestState.WAITING
    submitted_at: float = 0.0  # when it reached the engine (the loop's clock)
    queued_at: float = 0.0  # when it joined the queue: a decode leg's transfer after arrival
    decode_leg: bool = False  # its prompt's KV cache was pulled from a prefill engine
    transfer_s: float = 0.0  # how long that pull took (0 for a request prefilled here)
    prefill_started_at: float = 0.0
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    preempted_at: float | None = None  # preempted, not yet resumed
    _queue: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)

    @property
    def completion_tokens(self) -> int:
        """How many tokens the request will produce in all."""
        return len(self.tokens)

    @property
    def prefill_tokens(self) -> int:
        """Tokens its next prefill computes: the last prompt token alone at a decode leg's
        first (the rest was pulled); else its prompt and output (a preemption frees all)."""
        if self.decode_leg and self.generated == 0:
            return 1
        return self.prompt_tokens + self.generated

    def emit(self, text: str) -> None:
        """The engine's step produced ``text`` for this sequence (called by the engine)."""
        self._queue.put_nowait(text)

    def stop(self) -> None:
        """The engine stopped: whoever waits on ``next_token`` gets ``EngineStopped``."""
        self._queue.put_nowait(None)

    async def next_token(self) -> str:
        """The next token's text, as soon as the engine emits it."""
        item = await self._queue.get()
        if item is None:
            raise EngineStopped
        return item
