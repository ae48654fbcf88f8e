"""vLLM's gRPC engine API (``vllm.grpc.engine.VllmEngine``, smg-grpc-proto's vllm_engine.proto).

Generate (streamed or not, its prompt tokenized or as text), Abort of the named requests,
HealthCheck, GetModelInfo, GetServerInfo and GetLoads (the engine's batch and queue); Embed and
the rest answer UNIMPLEMENTED. ``n`` is not fanned out: one sequence per request.
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    vllm_engine_pb2 as pb,
)

from llmobs.sim.dialects.base import BadRequest, count_prompt_tokens
from llmobs.sim.grpc_engine.generate import generate_behaviour
from llmobs.sim.grpc_engine.serving import (
    VERSION,
    Ask,
    Served,
    Service,
    answer,
    ask_tokens,
    max_tokens_of,
    timestamp,
)

SERVICE = pb.DESCRIPTOR.services_by_name["VllmEngine"]


class VllmShape:
    """vLLM's GenerateRequest read, its GenerateResponse made."""

    def ask(self, request: Any) -> Ask:
        params = request.sampling_params
        source = request.WhichOneof("input")
        if source == "tokenized":
            count, prompt = ask_tokens(request.tokenized.input_ids)
        elif source == "text" and request.text:
            count, prompt = count_prompt_tokens(request.text), request.text.encode()
        else:
            raise BadRequest("the request has no prompt: give 'tokenized' or 'text'")
        limit = params.max_tokens if params.HasField("max_tokens") else None
        seed = params.seed if params.HasField("seed") else None
        return Ask(
            request.request_id,
            count,
            prompt,
            max_tokens_of(limit, "max_tokens"),
            request.stream,
            seed,
            params.ignore_eos,
        )

    def chunk(self, ask: Ask, ids: list[int], prompt_tokens: int, completion_tokens: int) -> Any:
        chunk = pb.GenerateStreamChunk(
            token_ids=ids, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        return pb.GenerateResponse(chunk=chunk)

    def complete(self, ask: Ask, ids: list[int], finish_reason: str, prompt_tokens: int) -> Any:
        complete = pb.GenerateComplete(
            output_ids=ids,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(ids),
        )
        return pb.GenerateResponse(complete=complete)


def service(served: Served) -> Service:
    """The methods the sim serves of vLLM's engine API."""

    def abort(request: Any) -> Any:
        served.abort(request.request_ids)
        return pb.AbortResponse()

    def server_info(request: Any) -> Any:
        return pb.GetServerInfoResponse(
            active_requests=served.active(),
            uptime_seconds=served.uptime(),
            server_type="vllm-grpc",
            data_parallel_size=1,
        )

    def loads(request: Any) -> Any:
        return pb.GetLoadsResponse(
            timestamp=timestamp(),
            version=VERSION,
            dp_rank_count=1,
            loads=[pb.SchedulerLoad(**served.load())],
        )

    return SERVICE, {
        "Generate": generate_behaviour(served, VllmShape()),
        "HealthCheck": answer(lambda _: pb.HealthCheckResponse(healthy=True, message="ok")),
        "Abort": answer(abort),
        "GetModelInfo": answer(lambda _: pb.GetModelInfoResponse(**served.model_card())),
        "GetServerInfo": answer(server_info),
        "GetLoads": answer(loads),
    }
