"""The engines' gRPC APIs as tests drive them: vLLM's, SGLang's and TensorRT-LLM's Generate
(smg-grpc-proto's stubs), a request of each, and grpc.aio's channel options."""

from __future__ import annotations

import asyncio
import queue
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as triton_client
from grpc import aio  # type: ignore[import-untyped, unused-ignore]
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    sglang_scheduler_pb2 as sglang,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    sglang_scheduler_pb2_grpc as sglang_grpc,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    trtllm_service_pb2 as trtllm,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    trtllm_service_pb2_grpc as trtllm_grpc,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    vllm_engine_pb2 as vllm,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    vllm_engine_pb2_grpc as vllm_grpc,
)
from tritonclient.grpc import service_pb2 as kserve

PROMPT = [1, 2, 3, 4, 5]
# a channel's connection its own, closed with it (not left in grpc's global pool, where the
# server's stop would cancel it: grpc logs that GOAWAY)
LOCAL = [("grpc.use_local_subchannel_pool", 1)]


@dataclass(frozen=True)
class Api:
    """One of the smg-grpc-proto engine APIs, as a test drives its Generate."""

    name: str
    stub: Callable[[Any], Any]
    request: Callable[[str, int, bool], Any]  # (request id, max tokens, stream) -> request
    output_ids: Callable[[Any], list[int]]  # a complete message's ids
    abort: Callable[[str], Any]  # request id -> AbortRequest
    echoes: bool  # whether each response carries the request id


def _vllm(request_id: str, max_tokens: int, stream: bool) -> Any:
    params = vllm.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    tokens = vllm.TokenizedInput(input_ids=PROMPT)
    return vllm.GenerateRequest(
        request_id=request_id, tokenized=tokens, sampling_params=params, stream=stream
    )


def _sglang(request_id: str, max_tokens: int, stream: bool) -> Any:
    params = sglang.SamplingParams(max_new_tokens=max_tokens, ignore_eos=True)
    tokens = sglang.TokenizedInput(input_ids=PROMPT)
    return sglang.GenerateRequest(
        request_id=request_id, tokenized=tokens, sampling_params=params, stream=stream
    )


def _trtllm(request_id: str, max_tokens: int, stream: bool) -> Any:
    tokens = trtllm.TokenizedInput(input_token_ids=PROMPT)
    return trtllm.GenerateRequest(
        request_id=request_id, tokenized=tokens, max_tokens=max_tokens, streaming=stream,
        ignore_eos=True,
    )  # fmt: skip


VLLM = Api("vllm", vllm_grpc.VllmEngineStub, _vllm, lambda c: list(c.output_ids),
           lambda i: vllm.AbortRequest(request_ids=[i]), echoes=False)  # fmt: skip
SGLANG = Api("sglang", sglang_grpc.SglangSchedulerStub, _sglang, lambda c: list(c.output_ids),
             lambda i: sglang.AbortRequest(request_id=i), echoes=True)  # fmt: skip
TRTLLM = Api("trtllm", trtllm_grpc.TrtllmServiceStub, _trtllm,
             lambda c: list(c.output_token_ids), lambda i: trtllm.AbortRequest(request_id=i),
             echoes=True)  # fmt: skip


async def responses(call: Any) -> list[Any]:
    """Every message of a server-streaming call, read one at a time."""
    out = []
    while (message := await call.read()) is not aio.EOF:
        out.append(message)
    return out


def raw_bytes(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<I", len(data)) + data


def infer_request(request_id: str, max_tokens: int, prompt: str = "Hello there") -> Any:
    """A ModelInferRequest as tritonclient makes one: every input in raw_input_contents."""
    tensor = kserve.ModelInferRequest.InferInputTensor
    inputs = [tensor(name="text_input", datatype="BYTES", shape=[1, 1]),
              tensor(name="max_tokens", datatype="INT32", shape=[1, 1]),
              tensor(name="stream", datatype="BOOL", shape=[1, 1])]  # fmt: skip
    raw = [raw_bytes(prompt), struct.pack("<i", max_tokens), b"\x01"]
    return kserve.ModelInferRequest(
        model_name="ensemble", id=request_id, inputs=inputs, raw_input_contents=raw
    )


def final(response: Any) -> bool:
    return bool(response.parameters["triton_final_response"].bool_param)


class Requests:
    """A ModelStreamInfer call's request stream, fed by the test as it goes."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def send(self, request: Any) -> None:
        self._queue.put_nowait(request)

    def close(self) -> None:
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[Any]:
        while (request := await self._queue.get()) is not None:
            yield request


def tritonclient_stream(url: str, max_tokens: int) -> list[str]:
    """A decoupled model's stream as tritonclient's (threaded) client reads one."""
    client = triton_client.InferenceServerClient(url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("ensemble")
        assert client.get_model_metadata("ensemble").platform == "ensemble"
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        text = triton_client.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([["Tell me a story."]], dtype=object))
        limit = triton_client.InferInput("max_tokens", [1, 1], "INT32")
        limit.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
        stream = triton_client.InferInput("stream", [1, 1], "BOOL")
        stream.set_data_from_numpy(np.array([[True]], dtype=bool))
        client.async_stream_infer(
            "ensemble", [text, limit, stream], request_id="tc", enable_empty_final_response=True
        )
        texts = []
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            assert response.id == "tc"
            if response.parameters["triton_final_response"].bool_param:
                break
            texts.append(result.as_numpy("text_output")[0][0].decode())
        client.stop_stream()
        return texts
    finally:
        client.close()
