"""What the gRPC APIs share: a request in the engine from its arrival to its end, served as the
HTTP handler serves one (``sim.server``): counted, refused when its body is bad or the seed
injects an error, submitted, read chunk by chunk, and cancelled the moment its call ends
unfinished (its client gone), as vLLM aborts such a request; and the ids Abort names.

Abort ends a request's stream early: its sequence leaves the batch (counted as cancelled) and
the stream's reader is woken with what it was sent so far, finished as ``abort``.
"""

from __future__ import annotations

import array
import datetime
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc  # type: ignore[import-untyped, unused-ignore]

from llmobs.sim.dialects.base import BadRequest
from llmobs.sim.engine import SimEngine
from llmobs.sim.request import EOS_TOKEN_ID, TOKENS, RequestState, SimRequest, token_id

ABORT = "abort"  # the finish reason of a request Abort ended (vLLM's, SGLang's)
MAX_CONTEXT = 8192  # the context length the model card states (Llama 3 8B's)
VOCAB_SIZE = max(token_id(text) for text in TOKENS) + 1  # the sim's own vocabulary
BOS_TOKEN_ID = 1  # Llama-2's, as EOS_TOKEN_ID is
ARCHITECTURE = "LlamaForCausalLM"
VERSION = "llmobs-sim"  # what a server info's version says
_LIVE = (RequestState.TRANSFERRING, RequestState.WAITING, RequestState.RUNNING)

# a servicer's method as grpc.aio calls it: (request or request iterator, context) -> answer
Behaviour = Callable[[Any, Any], Any]
# an API: its service's descriptor and the methods served (the others: UNIMPLEMENTED)
Service = tuple[Any, dict[str, Behaviour]]


def answer(make: Callable[[Any], Any]) -> Behaviour:
    """A unary method whose answer is made from its request alone."""

    async def behaviour(request: Any, context: Any) -> Any:
        return make(request)

    return behaviour


class Refused(Exception):
    """A request answered with an error status instead of tokens (counted as an error)."""

    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Ask:
    """What a gRPC request asks of the engine, whatever its API."""

    request_id: str
    prompt_tokens: int
    prompt: bytes  # the prompt as the prefix cache keys it
    max_tokens: int | None
    stream: bool
    seed: int | None = None
    ignore_eos: bool = False


def ask_tokens(ids: Iterable[int]) -> tuple[int, bytes]:
    """A tokenized prompt's length and its prefix-cache key; an empty prompt is refused."""
    prompt = array.array("I", ids)
    if not prompt:
        raise BadRequest("the prompt has no tokens")
    return len(prompt), prompt.tobytes()


def max_tokens_of(value: int | None, name: str) -> int | None:
    """A request's output limit: at least one token (the engine emits one per prefill)."""
    if value is not None and value < 1:
        raise BadRequest(f"'{name}' must be >= 1")
    return value


A = TypeVar("A", bound=Ask)


@dataclass(eq=False)
class Call(Generic[A]):
    """One request's sequence in the engine, and whether Abort ended it."""

    ask: A
    job: SimRequest
    aborted: bool = False


class Served:
    """The engine as every gRPC API shares it, with its calls in flight by request id."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.started = time.monotonic()
        self._calls: dict[str, Call[Any]] = {}

    def admit(
        self, headers: Mapping[str, str], parse: Callable[[], A], abortable: bool = True
    ) -> Call[A]:
        """Count the request, parse it, inject an error, submit it: ``Refused`` or its call
        (one Abort can name when ``abortable``)."""
        engine = self.engine
        seq = engine.receive(headers)
        try:
            ask = parse()
        except BadRequest as exc:
            raise self.refuse(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if engine.injects_error(seq):
            raise self.refuse(grpc.StatusCode.INTERNAL, "simulated engine failure")
        engine.look_up_prefix(ask.prompt, ask.prompt_tokens)
        job = engine.submit(seq, ask.prompt_tokens, ask.max_tokens, ask.seed, ask.ignore_eos)
        call = Call(ask, job)
        if abortable and ask.request_id:
            self._calls[ask.request_id] = call
        return call

    def refuse(self, code: Any, message: str) -> Refused:
        """An error status to answer with, counted as the HTTP face counts its errors."""
        self.engine.record_error()
        return Refused(code, message)

    def stopped(self) -> Refused:
        """The engine shut down before the request finished."""
        return self.refuse(grpc.StatusCode.UNAVAILABLE, "engine shutting down")

    def end(self, call: Call[Any]) -> None:
        """The call is over: its sequence leaves the engine if unfinished (a no-op once done)."""
        self.engine.cancel(call.job)
        if self._calls.get(call.ask.request_id) is call:
            del self._calls[call.ask.request_id]

    def abort(self, request_ids: Iterable[str]) -> int:
        """End the named requests still in the engine; how many there were."""
        ended = 0
        for request_id in request_ids:
            call = self._calls.get(request_id)
            if call is None or call.job.state not in _LIVE:
                continue
            call.aborted = True
            self.engine.cancel(call.job)
            call.job.stop()  # wakes its reader, which sees ``aborted``
            ended += 1
        return ended

    def active(self) -> int:
        """Requests in the engine: running, waiting or pulling their KV cache."""
        counts = self.engine.counters
        return counts.running + counts.waiting + counts.transferring

    def load(self) -> dict[str, Any]:
        """A scheduler load as vLLM's and SGLang's GetLoads report it (one DP rank)."""
        engine = self.engine
        counts, settings = engine.counters, engine.settings
        return {
            "dp_rank": 0,
            "num_running_reqs": counts.running,
            "num_waiting_reqs": counts.waiting,
            "num_total_reqs": self.active(),
            "token_usage": engine.kv_cache_usage(),
            "max_running_requests": settings.max_batch,
            "max_total_num_tokens": settings.kv_capacity
            or settings.max_batch * settings.output_tokens_max,
        }

    def model_card(self) -> dict[str, Any]:
        """The model as vLLM's and SGLang's GetModelInfo describe it (their fields' names)."""
        settings = self.engine.settings
        model = settings.model
        return {
            "model_path": model,
            "tokenizer_path": settings.tokenizer_path or model,
            "served_model_name": model,
            "is_generation": True,
            "max_context_length": MAX_CONTEXT,
            "max_req_input_len": MAX_CONTEXT,
            "vocab_size": VOCAB_SIZE,
            "model_type": "llama",
            "architectures": [ARCHITECTURE],
            "eos_token_ids": [EOS_TOKEN_ID],
            "bos_token_id": BOS_TOKEN_ID,
        }

    def uptime(self) -> float:
        """Seconds since the gRPC APIs started serving."""
        return time.monotonic() - self.started


def headers_of(context: Any) -> dict[str, str]:
    """A call's metadata as the engine counts a request's headers (binary values left out)."""
    pairs = context.invocation_metadata() or ()
    return {key: value for key, value in pairs if isinstance(value, str)}


async def admitted(
    served: Served, context: Any, parse: Callable[[], A], abortable: bool = True
) -> Call[A]:
    """The request in the engine, or its call ended with the error status it is refused with."""
    try:
        return served.admit(headers_of(context), parse, abortable)
    except Refused as exc:
        await context.abort(exc.code, exc.message)
        raise  # not reached: abort raises


def timestamp() -> str:
    """Now in ISO 8601, as GetLoads stamps its answer."""
    return datetime.datetime.now(datetime.UTC).isoformat()
