"""TensorRT-LLM's gRPC service (``trtllm.TrtllmService``, smg-grpc-proto's trtllm_service.proto).

Generate (its prompt tokenized; ``max_tokens``, ``streaming``, ``ignore_eos``, the sampling
config's seed; the request id echoed), Abort, HealthCheck, GetModelInfo and GetServerInfo; the
rest answer UNIMPLEMENTED.
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    trtllm_service_pb2 as pb,
)

from llmobs.sim.grpc_engine.generate import generate_behaviour
from llmobs.sim.grpc_engine.serving import (
    MAX_CONTEXT,
    VERSION,
    VOCAB_SIZE,
    Ask,
    Served,
    Service,
    answer,
    ask_tokens,
    max_tokens_of,
)

SERVICE = pb.DESCRIPTOR.services_by_name["TrtllmService"]


class TrtllmShape:
    """TensorRT-LLM's GenerateRequest read, its GenerateResponse made."""

    def ask(self, request: Any) -> Ask:
        count, prompt = ask_tokens(request.tokenized.input_token_ids)
        config = request.sampling_config
        seed = config.seed if config.HasField("seed") else None
        return Ask(
            request.request_id,
            count,
            prompt,
            max_tokens_of(request.max_tokens, "max_tokens"),
            request.streaming,
            seed,
            request.ignore_eos,
        )

    def chunk(self, ask: Ask, ids: list[int], prompt_tokens: int, completion_tokens: int) -> Any:
        chunk = pb.GenerateStreamChunk(
            token_ids=ids, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        return pb.GenerateResponse(request_id=ask.request_id, chunk=chunk)

    def complete(self, ask: Ask, ids: list[int], finish_reason: str, prompt_tokens: int) -> Any:
        complete = pb.GenerateComplete(
            output_token_ids=ids,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(ids),
        )
        return pb.GenerateResponse(request_id=ask.request_id, complete=complete)


def service(served: Served) -> Service:
    """The methods the sim serves of TensorRT-LLM's service."""
    settings = served.engine.settings

    def abort(request: Any) -> Any:
        ended = served.abort([request.request_id])
        return pb.AbortResponse(success=ended > 0, message="" if ended else "no such request")

    model = pb.GetModelInfoResponse(
        model_id=settings.model,
        max_input_len=MAX_CONTEXT,
        max_seq_len=MAX_CONTEXT,
        max_batch_size=settings.max_batch,
        vocab_size=VOCAB_SIZE,
    )
    server = pb.GetServerInfoResponse(
        version=VERSION,
        backend="pytorch",
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        context_parallel_size=1,
        world_size=1,
    )
    return SERVICE, {
        "Generate": generate_behaviour(served, TrtllmShape()),
        "HealthCheck": answer(lambda _: pb.HealthCheckResponse(status="OK")),
        "Abort": answer(abort),
        "GetModelInfo": answer(lambda _: model),
        "GetServerInfo": answer(lambda _: server),
    }
