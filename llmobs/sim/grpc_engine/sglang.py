"""SGLang's gRPC scheduler API (``sglang.grpc.scheduler.SglangScheduler``, smg-grpc-proto's
sglang_scheduler.proto).

Generate (its prompt tokenized; ``max_new_tokens``, ``ignore_eos``; the request id echoed in
every response), Abort, HealthCheck, GetModelInfo, GetServerInfo and GetLoads; the rest answer
UNIMPLEMENTED. ``n`` is not fanned out: one sequence per request.
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    sglang_scheduler_pb2 as pb,
)

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

SERVICE = pb.DESCRIPTOR.services_by_name["SglangScheduler"]


class SglangShape:
    """SGLang's GenerateRequest read, its GenerateResponse made."""

    def ask(self, request: Any) -> Ask:
        params = request.sampling_params
        count, prompt = ask_tokens(request.tokenized.input_ids)
        limit = params.max_new_tokens if params.HasField("max_new_tokens") else None
        return Ask(
            request.request_id,
            count,
            prompt,
            max_tokens_of(limit, "max_new_tokens"),
            request.stream,
            ignore_eos=params.ignore_eos,
        )

    def chunk(self, ask: Ask, ids: list[int], prompt_tokens: int, completion_tokens: int) -> Any:
        chunk = pb.GenerateStreamChunk(
            token_ids=ids, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        return pb.GenerateResponse(request_id=ask.request_id, chunk=chunk)

    def complete(self, ask: Ask, ids: list[int], finish_reason: str, prompt_tokens: int) -> Any:
        complete = pb.GenerateComplete(
            output_ids=ids,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(ids),
        )
        return pb.GenerateResponse(request_id=ask.request_id, complete=complete)


def service(served: Served) -> Service:
    """The methods the sim serves of SGLang's scheduler API."""

    def abort(request: Any) -> Any:
        ended = served.abort([request.request_id])
        return pb.AbortResponse(success=ended > 0, message="" if ended else "no such request")

    def server_info(request: Any) -> Any:
        load = served.load()
        return pb.GetServerInfoResponse(
            active_requests=served.active(),
            uptime_seconds=served.uptime(),
            sglang_version=VERSION,
            server_type="grpc",
            max_total_num_tokens=load["max_total_num_tokens"],
        )

    def loads(request: Any) -> Any:
        return pb.GetLoadsResponse(
            timestamp=timestamp(),
            version=VERSION,
            dp_rank_count=1,
            loads=[pb.SchedulerLoad(**served.load())],
        )

    return SERVICE, {
        "Generate": generate_behaviour(served, SglangShape()),
        "HealthCheck": answer(lambda _: pb.HealthCheckResponse(healthy=True, message="ok")),
        "Abort": answer(abort),
        "GetModelInfo": answer(lambda _: pb.GetModelInfoResponse(**served.model_card())),
        "GetServerInfo": answer(server_info),
        "GetLoads": answer(loads),
    }
