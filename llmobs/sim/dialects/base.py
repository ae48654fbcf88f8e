"""What every dialect of the sim shares: request parsing helpers and the renderer interface.

A dialect is only a renderer: the engine decides what is generated and when, and the server
relays each ``Chunk`` of a ``SimRequest`` the moment the engine emits it. A dialect turns the
request body into an ``Exchange`` (what to ask the engine for, whether to stream) and the
exchange turns chunks into that API's bytes. Keeping timing out of here is what lets one
timing model, and the tests of it, cover every API the sidecar reads.
"""

from __future__ import annotations

import json
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llmobs.sim.pd import NONE, KvSource, Leg
from llmobs.sim.request import SimRequest


class BadRequest(ValueError):
    """The body is not a valid request in its dialect; answered with that dialect's 4xx."""


def dumps(obj: Any) -> str:
    """Compact JSON, as vLLM writes it (and cheaper to send per token)."""
    return json.dumps(obj, separators=(",", ":"))


def count_prompt_tokens(text: str) -> int:
    """About four characters per token, the usual rule of thumb for English BPE."""
    return max(1, math.ceil(len(text) / 4))


def content_text(content: Any) -> str:
    """The text of a message's content: a string or a list of parts with ``text``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    raise BadRequest("message content must be a string or a list of content parts")


def messages_text(messages: Any, name: str = "messages") -> str:
    """The concatenated content of a non-empty list of message objects."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"'{name}' is required and must be a non-empty list")
    if not all(isinstance(m, dict) for m in messages):
        raise BadRequest("each message must be an object")
    return "".join(content_text(m.get("content")) for m in messages)


def load_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or ``BadRequest``."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def optional_int(body: dict[str, Any], name: str, minimum: int | None = None) -> int | None:
    """An optional integer field (booleans are not integers here)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer")
    if minimum is not None and value < minimum:
        raise BadRequest(f"'{name}' must be >= {minimum}")
    return value


def optional_object(body: dict[str, Any], name: str) -> dict[str, Any]:
    """An optional object field; absent or null reads as empty."""
    value = body.get(name) or {}
    if not isinstance(value, dict):
        raise BadRequest(f"'{name}' must be an object")
    return value


def model_of(body: dict[str, Any], default: str) -> str:
    """The requested model name; the sim serves any name, defaulting to its own."""
    model = body.get("model")
    return model if isinstance(model, str) and model else default


@dataclass(frozen=True)
class Context:
    """What a dialect takes from the server besides the body: its model, a wall clock, and
    what the path says (``params``, e.g. the model Triton's paths name).

    ``received_ns`` (CLOCK_MONOTONIC, set only with ``SimSettings.stamp``) turns stamping on:
    see ``stamp_event``.
    """

    model: str
    wall_clock: Callable[[], float] = field(default=time.time)
    received_ns: int | None = None
    request_id: str | None = None  # the client's X-Request-Id: vLLM makes it the response's id
    params: Mapping[str, str] = field(default_factory=dict)  # the path's (Triton's model)
    per_request_metrics: bool = False  # vLLM's per-request ``metrics`` in OpenAI answers
    pd_role: str = NONE  # how OpenAI requests' ``kv_transfer_params`` are read (``pd``)
    kv_source: KvSource | None = None  # this engine, as a prefill leg's answer names it


# Stamps ride in the token text itself, the one thing every OpenAI-compatible proxy passes on
# (LiteLLM re-serialises chunks and drops unknown fields): ``" lorem llmobs_sent_ns=123"``.
SENT_MARK = "llmobs_sent_ns="
RECEIVED_MARK = "llmobs_received_ns="
STAMP_SLOT = "\x00llmobs-stamp\x00"  # put at the end of a token's text, replaced at send time
_SLOT_JSON = json.dumps(STAMP_SLOT)[1:-1]  # how compact JSON writes it


def stamp_event(event_json: str, received_ns: int | None) -> bytes:
    """``data: {...}`` with the slot in its text replaced by the send time, just before the write.

    The stamp is ``time.monotonic_ns()`` read here, after the JSON is rendered, so it is the
    moment just before the server writes the event: CLOCK_MONOTONIC is one clock for every
    process on a Linux host, so a client subtracts it from its own arrival time and gets the
    delivery delay of this very chunk, whatever proxy sits between. ``received_ns`` (when the
    engine had the request; in the first token only) lets the client split its TTFT into the
    request's path, the engine's wait and the first chunk's path.
    """
    first = f" {RECEIVED_MARK}{received_ns}" if received_ns is not None else ""
    stamp = f"{first} {SENT_MARK}{time.monotonic_ns()}"
    return f"data: {event_json.replace(_SLOT_JSON, stamp, 1)}\n\n".encode()


@dataclass(frozen=True)
class Plan:
    """What to ask the engine for: one sequence per choice, all with these parameters."""

    prompt_tokens: int
    max_tokens: int | None = None
    seed: int | None = None
    ignore_eos: bool = False
    n: int = 1
    eos: bool = False
    leg: Leg = Leg.LOCAL  # one side of disaggregated prefill/decode, or served whole here


@dataclass(frozen=True)
class Chunk:
    """Tokens of one choice sent in one event: the first alone, then ``tokens_per_chunk``."""

    tokens: tuple[str, ...]
    start: int  # how many tokens of this choice were sent before
    last: bool

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def end(self) -> int:
        """Tokens of this choice sent once this chunk is."""
        return self.start + len(self.tokens)


class ChunkReader:
    """Groups one sequence's tokens into chunks: the first alone, then ``every`` at a time.

    A chunk is complete the moment the engine emits its last token, so each write happens at
    an engine step's deadline, as vLLM's ``--stream-interval`` does.
    """

    def __init__(self, job: SimRequest, every: int) -> None:
        self._job = job
        self._every = every
        self._sent = 0

    async def read(self) -> Chunk | None:
        """The next chunk, or None once every token has been read."""
        total = self._job.completion_tokens
        if self._sent == total:
            return None
        size = 1 if self._sent == 0 else min(self._every, total - self._sent)
        tokens = tuple([await self._job.next_token() for _ in range(size)])
        chunk = Chunk(tokens, self._sent, self._sent + size == total)
        self._sent += size
        return chunk


class Exchange(ABC):
    """One request in one dialect: the parsed call and the renderer of its answer.

    The server writes ``head()`` as soon as the response starts (events an API sends before
    any token), then ``chunk()`` per chunk, choices interleaved round-robin, then ``tail()``.
    ``full()`` is the body of a non-streamed answer, rendered once every token is out.
    """

    media_type: ClassVar[str] = "text/event-stream; charset=utf-8"
    one_token_per_event: ClassVar[bool] = False  # TGI: tokens_per_chunk does not apply

    def __init__(self, plan: Plan, stream: bool) -> None:
        self.plan = plan
        self.stream = stream

    def head(self) -> bytes:
        return b""

    @abstractmethod
    def chunk(self, index: int, chunk: Chunk, job: SimRequest) -> bytes:
        """The bytes carrying ``chunk`` of choice ``index``."""

    @abstractmethod
    def tail(self, jobs: Sequence[SimRequest]) -> bytes:
        """The bytes that close a stream whose every token has been sent."""

    @abstractmethod
    def full(self, jobs: Sequence[SimRequest]) -> str:
        """The JSON body of a non-streamed answer."""


@dataclass(frozen=True)
class Endpoint:
    """One route of a dialect: its path, body parser and error document."""

    path: str
    parse: Callable[[bytes, Context], Exchange]
    error: Callable[[str, int], str]  # (message, HTTP status) -> JSON body
    bad_request_status: int = 400


# a client's streaming request in a dialect's own shape: (model, prompt, max tokens, chat or
# a plain completion) -> (path, JSON body); what the traffic tool sends
ClientRequest = Callable[[str, str, int, bool], tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Api:
    """One API the sim speaks: the routes it serves, and a client's request in its shape
    (the traffic tool's), kept together so that a new dialect is one module and one line."""

    endpoints: tuple[Endpoint, ...]
    request: ClientRequest


def sse(event: str, data: str) -> bytes:
    """A named server-sent event, as Anthropic and the OpenAI Responses API write them."""
    return f"event: {event}\ndata: {data}\n\n".encode()
