"""The engines' gRPC APIs as dialects (``observe.dialects.grpc``): messages made with the
published protos' own classes, read back for tokens, usage, finish reasons, models, errors and
statuses; a broken message counted, never raised; a request's first message read for its
stream flag and limit."""

from __future__ import annotations

from typing import Any

import pytest
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    sglang_scheduler_pb2 as sglang,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    trtllm_service_pb2 as trtllm,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    vllm_engine_pb2 as vllm,
)
from tritonclient.grpc import service_pb2 as kserve

from llmobs.observe.dialects import (
    SGLANG_GRPC,
    TRITON_GRPC_STREAM,
    TRTLLM_GRPC,
    VLLM_GRPC,
    VLLM_MODEL_INFO,
    route_for_path,
)
from llmobs.observe.dialects.base import ERROR, LENGTH, NONE, STOP
from llmobs.observe.dialects.grpc import (
    GenerateStream,
    ModelInfoReply,
    ServedModel,
    SglangStream,
    TritonGrpcStream,
    TritonInfer,
    TrtllmModelInfo,
    TrtllmStream,
    http_status,
    status_of,
)
from llmobs.observe.dialects.request import parse_grpc_request


def chunk(ids: list[int], done: int, index: int = 0) -> bytes:
    part = vllm.GenerateStreamChunk(token_ids=ids, prompt_tokens=7, completion_tokens=done,
                                    cached_tokens=3, index=index)  # fmt: skip
    return bytes(vllm.GenerateResponse(chunk=part).SerializeToString())


def complete(reason: str, ids: list[int]) -> bytes:
    part = vllm.GenerateComplete(output_ids=ids, finish_reason=reason, prompt_tokens=7,
                                 completion_tokens=len(ids))  # fmt: skip
    return bytes(vllm.GenerateResponse(complete=part).SerializeToString())


def test_vllms_chunks_are_their_token_ids_and_usage_the_running_counts() -> None:
    dialect = GenerateStream()
    assert [dialect.on_data(chunk([5], 1)), dialect.on_data(chunk([6, 7], 3))] == [1, 2]
    assert dialect.on_data(complete("length", [5, 6, 7])) == 0  # counted in its chunks
    assert (dialect.input_tokens, dialect.output_tokens, dialect.cached_tokens) == (7, 3, 3)
    assert dialect.per_chunk_usage and dialect.done and dialect.finish_reason == LENGTH
    assert dialect.malformed == 0 and not dialect.error


def test_a_second_sequence_is_pending_for_its_own_clock() -> None:
    dialect = GenerateStream()
    assert dialect.on_data(chunk([1], 1, index=0)) == 1
    assert dialect.on_data(chunk([2, 3], 2, index=1)) == 2
    assert dialect.take_pending() == {1: 2}


def test_an_answer_not_streamed_is_counted_but_not_timed() -> None:
    dialect = GenerateStream()
    assert dialect.on_data(complete("stop", [1, 2, 3, 4])) == 0
    assert (dialect.output_tokens, dialect.finish_reason) == (4, STOP)
    assert not dialect.per_chunk_usage


def test_sglang_and_trtllm_are_read_in_their_own_shapes() -> None:
    sg = SglangStream()
    part = sglang.GenerateStreamChunk(token_ids=[1, 2], prompt_tokens=4, completion_tokens=2)
    assert sg.on_data(sglang.GenerateResponse(request_id="r", chunk=part).SerializeToString()) == 2
    trt = TrtllmStream()
    part = trtllm.GenerateStreamChunk(token_ids=[9], sequence_index=1, prompt_tokens=4,
                                      completion_tokens=1)  # fmt: skip
    assert trt.on_data(trtllm.GenerateResponse(chunk=part).SerializeToString()) == 1
    assert trt.take_pending() == {1: 1}
    end = trtllm.GenerateComplete(output_token_ids=[9], finish_reason="stop_word")
    trt.on_data(trtllm.GenerateResponse(complete=end).SerializeToString())
    assert trt.finish_reason == STOP


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x0a\x05ab"])
def test_a_broken_message_is_counted_not_raised(data: bytes) -> None:
    dialect = GenerateStream()
    assert dialect.on_data(data) == 0
    assert dialect.malformed == 1 and dialect.finish_reason == NONE


def test_a_status_other_than_ok_is_the_calls_error() -> None:
    dialect = GenerateStream()
    dialect.on_status(0)
    assert not dialect.error and dialect.grpc_status == 0
    dialect.on_status(14)
    assert dialect.error and dialect.grpc_status == 14


def test_statuses_read_from_trailers_and_their_http_meaning() -> None:
    assert status_of([("content-type", "x"), ("Grpc-Status", " 5 ")]) == 5
    assert [status_of([("grpc-status", v)]) for v in ("", "-1", "abc", "1234")] == [None] * 4
    assert status_of([]) is None
    assert [http_status(c) for c in (0, 1, 3, 4, 5, 8, 12, 13, 14, 16, 99)] == [
        200, 499, 400, 504, 404, 429, 404, 500, 503, 401, 500]  # fmt: skip


def triton_response(text: bytes | None, final: bool = False, count: int | None = None) -> Any:
    response = kserve.ModelInferResponse(model_name="ensemble", id="r")
    if text is not None:
        response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
        response.raw_output_contents.append(len(text).to_bytes(4, "little") + text)
    if count is not None:
        response.outputs.add(name="num_output_tokens", datatype="INT32", shape=[1, 1])
        response.raw_output_contents.append(count.to_bytes(4, "little"))
    response.parameters["triton_final_response"].bool_param = final
    return response


def test_triton_counts_a_token_per_response_unless_the_engine_counts() -> None:
    dialect = TritonGrpcStream()
    stream = kserve.ModelStreamInferResponse
    counts = [dialect.on_data(stream(infer_response=triton_response(b" hi")).SerializeToString()),
              dialect.on_data(stream(infer_response=triton_response(b"ab", count=2))
                              .SerializeToString()),
              dialect.on_data(stream(infer_response=triton_response(None, final=True))
                              .SerializeToString())]  # fmt: skip
    assert counts == [1, 2, 0]
    assert dialect.done and dialect.response_model == "ensemble" and not dialect.error
    failed = TritonGrpcStream()
    assert failed.on_data(stream(error_message="model not ready").SerializeToString()) == 0
    assert failed.error and failed.finish_reason == ERROR


def test_tritons_unary_answer_is_counted_not_timed() -> None:
    dialect = TritonInfer()
    assert dialect.on_data(triton_response(b"whole text", count=3).SerializeToString()) == 0
    assert (dialect.output_tokens, dialect.done) == (3, True)


def test_the_model_infos_name_the_served_model() -> None:
    info = ModelInfoReply()
    info.on_data(vllm.GetModelInfoResponse(model_path="/m/llama", served_model_name="llama")
                 .SerializeToString())  # fmt: skip
    assert info.response_model == "llama"
    path = ModelInfoReply()
    path.on_data(vllm.GetModelInfoResponse(model_path="/m/llama").SerializeToString())
    assert path.response_model == "/m/llama"
    trt = TrtllmModelInfo()
    trt.on_data(trtllm.GetModelInfoResponse(model_id="trt-model").SerializeToString())
    assert trt.response_model == "trt-model"


def first(message: Any, compressed: bool = False) -> bytes:
    data = bytes(message.SerializeToString())
    return bytes([compressed]) + len(data).to_bytes(4, "big") + data


def test_a_requests_first_message_says_its_stream_flag_limit_and_model() -> None:
    params = vllm.SamplingParams(max_tokens=16)
    request = vllm.GenerateRequest(request_id="r", sampling_params=params, stream=True)
    served = ServedModel()
    info = parse_grpc_request(first(request), VLLM_GRPC, served)
    assert (info.stream, info.max_tokens, info.model) == (True, 16, None)
    served.name = "llama"
    assert parse_grpc_request(first(request), VLLM_GRPC, served).model == "llama"
    sg = sglang.GenerateRequest(sampling_params=sglang.SamplingParams(max_new_tokens=4))
    assert parse_grpc_request(first(sg), SGLANG_GRPC).stream is False
    assert parse_grpc_request(first(sg), SGLANG_GRPC).max_tokens == 4
    trt = trtllm.GenerateRequest(max_tokens=9, streaming=True)
    assert parse_grpc_request(first(trt), TRTLLM_GRPC)[1:4:2] == (True, 9)
    triton = kserve.ModelInferRequest(model_name="ensemble")
    info = parse_grpc_request(first(triton), TRITON_GRPC_STREAM)
    assert (info.model, info.stream) == ("ensemble", True)  # its stream always streams
    # compressed, cut, broken or not a message at all: nothing said, nothing raised
    for body in (first(request, compressed=True), b"\x00\x00", b"\x00\x00\x00\x00\x03\xff\xff"):
        assert parse_grpc_request(body, VLLM_GRPC).model is None


def test_the_methods_are_routed_by_their_exact_paths() -> None:
    assert route_for_path("/vllm.grpc.engine.VllmEngine/Generate") is VLLM_GRPC
    assert route_for_path("/vllm.grpc.engine.VllmEngine/GetModelInfo") is VLLM_MODEL_INFO
    assert route_for_path("/vllm.grpc.engine.VllmEngine/HealthCheck").name == "none"
    assert route_for_path("/x/vllm.grpc.engine.VllmEngine/Generate").name == "none"
