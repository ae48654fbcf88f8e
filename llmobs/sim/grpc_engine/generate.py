"""Generate as vLLM's, SGLang's and TensorRT-LLM's gRPC servers stream it (smg-grpc-proto).

Streamed: a chunk per group of the engine's tokens (the first alone, then ``tokens_per_chunk``
at a time, as the HTTP streams group them) with their ids, the prompt's token count and the
cumulative completion's, then one complete message with every output id and the finish
reason; unstreamed, the complete message alone. The three APIs differ only in their messages'
shapes (``Shape``); a refused request ends with its status before any message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from llmobs.sim.dialects.base import ChunkReader
from llmobs.sim.grpc_engine.serving import ABORT, Ask, Behaviour, Served, admitted
from llmobs.sim.request import EngineStopped, token_id


class Shape(Protocol):
    """An API's Generate: its request read, its messages made."""

    def ask(self, request: Any) -> Ask:
        """What the request asks of the engine; ``BadRequest`` if it cannot be served."""

    def chunk(self, ask: Ask, ids: list[int], prompt_tokens: int, completion_tokens: int) -> Any:
        """A streamed chunk: its new ids, the prompt's count and the completion's so far."""

    def complete(self, ask: Ask, ids: list[int], finish_reason: str, prompt_tokens: int) -> Any:
        """The final message: every output id and why the output ended."""


async def generate(served: Served, shape: Shape, request: Any, context: Any) -> AsyncIterator[Any]:
    """One Generate call: its chunks as the engine emits them, then its complete message.

    A call that ends early (its client cancelled it) cancels its sequence at once, in
    ``Served.end``; one that Abort ended completes with what it had, as ``abort``.
    """
    call = await admitted(served, context, lambda: shape.ask(request))
    ask, job = call.ask, call.job
    ids: list[int] = []
    finish_reason = job.finish_reason
    try:
        if ask.stream:
            reader = ChunkReader(job, served.engine.settings.tokens_per_chunk)
            while (chunk := await reader.read()) is not None:
                new = [token_id(text) for text in chunk.tokens]
                ids += new
                yield shape.chunk(ask, new, job.prompt_tokens, chunk.end)
        else:
            while len(ids) < job.completion_tokens:
                ids.append(token_id(await job.next_token()))
    except EngineStopped:
        if not call.aborted:
            stopped = served.stopped()
            await context.abort(stopped.code, stopped.message)
        finish_reason = ABORT
    finally:
        served.end(call)
    yield shape.complete(ask, ids, finish_reason, job.prompt_tokens)


def generate_behaviour(served: Served, shape: Shape) -> Behaviour:
    """Generate as a servicer's method (an async generator, as grpc.aio streams one)."""

    async def behaviour(request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in generate(served, shape, request, context):
            yield response

    return behaviour
