"""Triton's gRPC API (``inference.GRPCInferenceService``, tritonclient's service.proto), as
TensorRT-LLM's ``ensemble`` (or ``tensorrt_llm_bls``) model answers it in decoupled mode.

A request's inputs are the ensemble's, named as the generate extension names its fields
(``dialects/triton.py``): ``text_input`` (the prompt, its tokens counted as there),
``max_tokens``, ``stream``, ``random_seed`` (or ``seed``), ``exclude_input_in_output``,
``return_num_input_tokens`` and ``return_num_output_tokens`` (``tensors`` reads them).

ModelStreamInfer: every request on the stream is its own sequence in the engine, served in
parallel, its responses carrying its id: a ``text_output`` delta per chunk of tokens, then an
empty response flagged ``triton_final_response`` (as Triton ends a decoupled model's request
for a client that sets ``triton_enable_empty_final_response``; sent always here). ``stream``
false: one response with the whole text, then the final one. A refused request (a bad input,
an injected error) is a response with its ``error_message``, as Triton reports one request's
error without ending the stream; the engine stopping ends it, UNAVAILABLE. ModelInfer: the
whole answer in one response, the prompt before it unless ``exclude_input_in_output``.
ServerLive, ServerReady, ModelReady, ServerMetadata and ModelMetadata answer as a server with
the model ready, whatever model a request names (the HTTP face serves any too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from llmobs.sim.dialects.base import BadRequest, ChunkReader, count_prompt_tokens
from llmobs.sim.grpc_engine.serving import (
    VERSION,
    Ask,
    Behaviour,
    Refused,
    Served,
    Service,
    admitted,
    answer,
    headers_of,
    max_tokens_of,
)
from llmobs.sim.grpc_engine.tensors import Inputs, bytes_tensor, int32_tensor
from llmobs.sim.request import EngineStopped, SimRequest

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
FINAL = "triton_final_response"
PLATFORM = "ensemble"
_ONE = [1, 1]  # a batch of one element: the shape of each of the ensemble's outputs
_END, _STOPPED = object(), object()  # a stream's queue: every request served; engine stopped


@dataclass(frozen=True, kw_only=True)
class Infer(Ask):
    """A ModelInferRequest as the ensemble reads it."""

    model: str
    version: str
    text: str
    echo: bool
    input_counts: bool
    output_counts: bool


def read(request: Any, model: str, streams: bool) -> Infer:
    """The request's inputs; ``streams``: token by token unless its ``stream`` says false."""
    inputs = Inputs(request)
    prompt = inputs.text("text_input")
    if prompt is None:
        raise BadRequest("'text_input' is required (a BYTES tensor)")
    seed = inputs.integer("random_seed")
    return Infer(
        request_id=request.id,
        prompt_tokens=count_prompt_tokens(prompt),
        prompt=prompt.encode(),
        max_tokens=max_tokens_of(inputs.integer("max_tokens"), "max_tokens"),
        stream=streams and inputs.flag("stream") is not False,
        seed=inputs.integer("seed") if seed is None else seed,
        model=request.model_name or model,
        version=request.model_version or "1",
        text=prompt,
        echo=inputs.flag("exclude_input_in_output") is not True,
        input_counts=inputs.flag("return_num_input_tokens") is True,
        output_counts=inputs.flag("return_num_output_tokens") is True,
    )


def response(
    infer: Infer, text: str | None, tokens: int, job: SimRequest, final: bool | None
) -> Any:
    """A ModelInferResponse: ``text`` and its ``tokens`` (none: the empty final one)."""
    outputs: list[tuple[str, str, bytes]] = []
    if text is not None:
        outputs.append(("text_output", "BYTES", bytes_tensor(text)))
        if infer.input_counts:
            outputs.append(("num_input_tokens", "INT32", int32_tensor(job.prompt_tokens)))
        if infer.output_counts:
            outputs.append(("num_output_tokens", "INT32", int32_tensor(tokens)))
    tensors = [
        pb.ModelInferResponse.InferOutputTensor(name=name, datatype=kind, shape=_ONE)
        for name, kind, _ in outputs
    ]
    params = {} if final is None else {FINAL: pb.InferParameter(bool_param=final)}
    return pb.ModelInferResponse(
        model_name=infer.model,
        model_version=infer.version,
        id=infer.request_id,
        outputs=tensors,
        raw_output_contents=[raw for *_, raw in outputs],
        parameters=params,
    )


async def _whole(job: SimRequest) -> str:
    return "".join([await job.next_token() for _ in range(job.completion_tokens)])


async def _serve(
    served: Served, request: Any, headers: dict[str, str], out: Callable[[Any], None]
) -> None:
    """One request of a stream: its responses handed to ``out`` as the engine emits tokens."""
    model = served.engine.settings.model
    try:
        call = served.admit(headers, lambda: read(request, model, True), abortable=False)
    except Refused as exc:
        refused = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        out(pb.ModelStreamInferResponse(error_message=exc.message, infer_response=refused))
        return
    infer, job = call.ask, call.job
    try:
        if infer.stream:
            reader = ChunkReader(job, served.engine.settings.tokens_per_chunk)
            while (chunk := await reader.read()) is not None:
                delta = response(infer, chunk.text, len(chunk.tokens), job, False)
                out(pb.ModelStreamInferResponse(infer_response=delta))
        else:
            text = await _whole(job)
            whole = response(
                infer, infer.text + text if infer.echo else text, job.completion_tokens, job, False
            )
            out(pb.ModelStreamInferResponse(infer_response=whole))
        out(pb.ModelStreamInferResponse(infer_response=response(infer, None, 0, job, True)))
    except EngineStopped:
        out(_STOPPED)
    finally:
        served.end(call)


async def _pump(
    served: Served,
    requests: AsyncIterator[Any],
    headers: dict[str, str],
    out: Callable[[Any], None],
) -> None:
    """Serve each request of the stream as it comes, in parallel, until every one is done."""
    async with asyncio.TaskGroup() as group:
        async for request in requests:
            group.create_task(_serve(served, request, headers, out))


def _stream_infer(served: Served) -> Behaviour:
    """ModelStreamInfer: the responses of the stream's requests, interleaved as they come.

    A stream its client cancels cancels its pump, whose tasks cancel their sequences.
    """

    async def behaviour(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        pump = asyncio.create_task(_pump(served, requests, headers_of(context), queue.put_nowait))
        pump.add_done_callback(lambda _: queue.put_nowait(_END))
        try:
            while (item := await queue.get()) is not _END:
                if item is _STOPPED:
                    stopped = served.stopped()
                    await context.abort(stopped.code, stopped.message)
                yield item
            pump.result()  # a reader's error
        finally:
            pump.cancel()
            await asyncio.wait([pump])

    return behaviour


def _infer(served: Served) -> Behaviour:
    """ModelInfer: the whole answer in one response."""
    model = served.engine.settings.model

    async def behaviour(request: Any, context: Any) -> Any:
        call = await admitted(served, context, lambda: read(request, model, False), abortable=False)
        infer, job = call.ask, call.job
        try:
            text = await _whole(job)
        except EngineStopped:
            stopped = served.stopped()
            await context.abort(stopped.code, stopped.message)
        finally:
            served.end(call)
        shown = infer.text + text if infer.echo else text
        return response(infer, shown, job.completion_tokens, job, None)

    return behaviour


def _model_metadata(model: str) -> Callable[[Any], Any]:
    tensor = pb.ModelMetadataResponse.TensorMetadata
    inputs = [
        tensor(name="text_input", datatype="BYTES", shape=[-1, 1]),
        tensor(name="max_tokens", datatype="INT32", shape=[-1, 1]),
        tensor(name="stream", datatype="BOOL", shape=[-1, 1]),
    ]
    outputs = [tensor(name="text_output", datatype="BYTES", shape=[-1, -1])]
    return lambda request: pb.ModelMetadataResponse(
        name=request.name or model,
        versions=["1"],
        platform=PLATFORM,
        inputs=inputs,
        outputs=outputs,
    )


def service(served: Served) -> Service:
    """The methods the sim serves of Triton's API."""
    model = served.engine.settings.model
    metadata = pb.ServerMetadataResponse(
        name="triton", version=VERSION, extensions=["binary_tensor_data", "parameters"]
    )
    return SERVICE, {
        "ServerLive": answer(lambda _: pb.ServerLiveResponse(live=True)),
        "ServerReady": answer(lambda _: pb.ServerReadyResponse(ready=True)),
        "ModelReady": answer(lambda _: pb.ModelReadyResponse(ready=True)),
        "ServerMetadata": answer(lambda _: metadata),
        "ModelMetadata": answer(_model_metadata(model)),
        "ModelInfer": _infer(served),
        "ModelStreamInfer": _stream_infer(served),
    }
