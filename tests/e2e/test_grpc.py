"""gRPC end to end: grpcio's own client with the generated stubs, through the sidecar (h2c on
both legs), to the sim's gRPC servers. Each engine API measured as the HTTP dialects are (its
counts the client's, its TTFT and gaps the schedule's, within the loopback's noise), every
other method relayed unchanged, a status passed on as it came, a cancelled call cancelled at
the engine, a bidirectional stream (Triton's) carried both ways at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
import pytest
from grpc import aio  # type: ignore[import-untyped, unused-ignore]
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    vllm_engine_pb2 as vllm,
)
from smg_grpc_proto.generated import (  # type: ignore[import-untyped, unused-ignore]
    vllm_engine_pb2_grpc as vllm_grpc,
)
from tritonclient.grpc import service_pb2_grpc as kserve_grpc

from llmobs.sim import SimEngine
from llmobs.sim.grpc_engine import start_grpc
from tests.support.grpc_apis import (
    LOCAL,
    PROMPT,
    SGLANG,
    TRTLLM,
    VLLM,
    Api,
    Requests,
    final,
    infer_request,
    tritonclient_stream,
)
from tests.support.ports import free_port
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

SCHEDULE: dict[str, Any] = {
    "max_batch": 4, "prefill_base": 0.1, "prefill_per_token": 0.0, "decode_base": 0.02,
    "decode_per_seq": 0.0, "output_tokens_min": 20, "output_tokens_max": 20,
}  # fmt: skip
STALL_MIN_GAP = 0.15  # (as tests/e2e/test_dialects.py: a late token on a loaded machine is none)
LATE = 0.075  # how late the loaded machine may make the first token
TOKENS = 20


@dataclass
class Stack:
    engine: SimEngine
    side: SidecarHandle
    channel: Any  # grpc.aio.Channel to the sidecar
    server: Any  # the sim's grpc.aio.Server


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def start_stack(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> AsyncIterator[StackFactory]:
    """The sim's gRPC face, a sidecar in front of it (its engine leg h2c, though requests of
    other APIs would go on HTTP/1.1), and a channel to the sidecar."""
    started: list[tuple[Any, Any]] = []

    async def start(**overrides: Any) -> Stack:
        sim = await start_sim(**{**SCHEDULE, **overrides})
        server, port = await start_grpc(sim.engine, "127.0.0.1", 0)
        side = await start_sidecar(f"http://127.0.0.1:{port}", stall_min_gap=STALL_MIN_GAP)
        channel = aio.insecure_channel(side.url.removeprefix("http://"), options=LOCAL)
        started.append((server, channel))
        return Stack(sim.engine, side, channel, server)

    yield start
    for server, channel in started:
        await channel.close()
        await server.stop(None)


async def _timed(call: Any) -> tuple[list[Any], list[float]]:
    """A server stream's messages and when the client read each (its own clock, seconds
    from the call)."""
    start = time.perf_counter()
    messages, times = [], []
    while (message := await call.read()) is not aio.EOF:
        messages.append(message)
        times.append(time.perf_counter() - start)
    return messages, times


@pytest.mark.parametrize("api", [pytest.param(a, id=a.name) for a in (VLLM, SGLANG, TRTLLM)])
async def test_generate_is_measured_as_the_client_and_the_engine_saw_it(
    start_stack: StackFactory, api: Api
) -> None:
    stack = await start_stack()
    call = api.stub(stack.channel).Generate(api.request("r-1", TOKENS, True))
    messages, times = await _timed(call)
    assert await call.code() == grpc.StatusCode.OK
    chunks = [(m.chunk, t) for m, t in zip(messages, times, strict=True) if m.HasField("chunk")]
    client_tokens = sum(len(chunk.token_ids) for chunk, _ in chunks)
    assert client_tokens == TOKENS and messages[-1].HasField("complete")
    side = stack.side
    name = f"{api.name}-grpc"
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="ok", finish_reason="length",
                      gen_ai_operation_name="text_completion") == 1  # fmt: skip
    # the token ids the client read, as the engine counted them; the prompt the engine's too
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                      token_count_source="usage") == TOKENS  # fmt: skip
    assert side.value("llmobs_tokens_total", gen_ai_token_type="input") == len(PROMPT)
    ttft = side.value("gen_ai_server_time_to_first_token_seconds_sum")
    assert 0.098 <= ttft <= 0.1 + LATE
    assert ttft <= chunks[0][1] + 0.002  # the sidecar sees the first token no later
    n = side.value("llmobs_inter_token_latency_seconds_count")
    assert n == TOKENS - 1
    mean = side.value("llmobs_inter_token_latency_seconds_sum") / n
    client_mean = (chunks[-1][1] - chunks[0][1]) / (TOKENS - 1)
    assert mean == pytest.approx(0.020, abs=0.004)
    assert mean == pytest.approx(client_mean, abs=0.004)
    assert side.value("llmobs_stalls_total") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0
    assert side.value("llmobs_api_requests_total", api=name, transport="grpc",
                      rpc_grpc_status_code="0") == 1  # fmt: skip


async def test_a_generate_not_streamed_is_one_answer_with_every_token(
    start_stack: StackFactory,
) -> None:
    stack = await start_stack()
    call = VLLM.stub(stack.channel).Generate(VLLM.request("whole", TOKENS, False))
    (message,) = [m async for m in call]
    assert len(message.complete.output_ids) == TOKENS
    side = stack.side
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output") == TOKENS
    assert side.value("gen_ai_server_time_to_first_token_seconds_count") == 0  # not streamed
    assert side.value("gen_ai_server_request_duration_seconds_count") == 1


async def test_every_other_method_and_status_passes_unchanged(start_stack: StackFactory) -> None:
    """Health, model info and a refused request: their answers, codes and messages as the
    engine gave them (a status in a "trailers-only" answer too)."""
    stack = await start_stack()
    stub = vllm_grpc.VllmEngineStub(stack.channel)
    health = await stub.HealthCheck(vllm.HealthCheckRequest())
    info = await stub.GetModelInfo(vllm.GetModelInfoRequest())
    assert health.healthy and info.served_model_name == stack.engine.settings.model
    with pytest.raises(aio.AioRpcError) as refused:
        await stub.Embed(vllm.EmbedRequest())
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    bad = VLLM.request("bad", TOKENS, True)
    bad.sampling_params.max_tokens = 0
    with pytest.raises(aio.AioRpcError) as invalid:
        [m async for m in stub.Generate(bad)]
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert invalid.value.details()  # the engine's message, as it wrote it
    side = stack.side
    await eventually(lambda: side.value("llmobs_requests_total") == 4)
    assert side.value("llmobs_api_requests_total", api="grpc", transport="grpc",
                      rpc_grpc_status_code="0") == 2  # fmt: skip
    assert side.value("llmobs_api_requests_total", rpc_grpc_status_code="12") == 1
    # an invalid argument is the client's mistake: a 4xx, judged in no SLO series; so is a
    # method the engine does not serve (UNIMPLEMENTED: an unknown path's 404), not a failure
    assert side.value("llmobs_requests_total", gen_ai_operation_name="text_completion",
                      status_class="4xx", finish_reason="error") == 1  # fmt: skip
    assert side.value("llmobs_slo_requests_total", verdict="bad") == 0
    assert side.value("llmobs_requests_total", status_class="4xx") == 2
    assert side.value("llmobs_requests_total", outcome="upstream_error") == 0


async def test_the_served_model_is_learned_from_the_engines_model_info(
    start_stack: StackFactory,
) -> None:
    """vLLM's Generate names no model: until the engine's GetModelInfo answer passed (a
    gateway asks when it registers the engine), its requests are under ``unknown``."""
    stack = await start_stack(model="served-llm")
    stub = VLLM.stub(stack.channel)
    [m async for m in stub.Generate(VLLM.request("before", 2, True))]
    await stub.GetModelInfo(vllm.GetModelInfoRequest())
    [m async for m in stub.Generate(VLLM.request("after", 2, True))]
    side = stack.side
    await eventually(lambda: side.value("llmobs_requests_total") == 3)
    ops = {"gen_ai_operation_name": "text_completion"}
    assert side.value("llmobs_requests_total", gen_ai_request_model="unknown", **ops) == 1
    assert side.value("llmobs_requests_total", gen_ai_request_model="served-llm", **ops) == 1


async def test_a_cancelled_call_is_cancelled_at_the_engine(start_stack: StackFactory) -> None:
    stack = await start_stack(output_tokens_min=100_000, output_tokens_max=100_000)
    call = VLLM.stub(stack.channel).Generate(VLLM.request("gone", 100_000, True))
    for _ in range(3):
        await call.read()
    call.cancel()
    engine, side = stack.engine, stack.side
    await eventually(lambda: engine.counters.cancelled == 1)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1


async def test_abort_through_the_sidecar_ends_a_running_generate(
    start_stack: StackFactory,
) -> None:
    stack = await start_stack(output_tokens_min=100_000, output_tokens_max=100_000)
    stub = VLLM.stub(stack.channel)
    call = stub.Generate(VLLM.request("to-abort", 100_000, True))
    await call.read()
    await stub.Abort(VLLM.abort("to-abort"))
    rest, _ = await _timed(call)
    assert rest[-1].complete.finish_reason == "abort"
    side = stack.side
    await eventually(lambda: side.value("llmobs_requests_total") == 2)
    assert side.value("llmobs_requests_total", finish_reason="aborted") == 1


async def test_a_triton_stream_flows_both_ways_at_once(start_stack: StackFactory) -> None:
    """ModelStreamInfer: the second request goes on the open stream once the first has ended,
    so the relay must carry the client's messages while the engine's flow back."""
    stack = await start_stack()
    requests = Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(stack.channel).ModelStreamInfer(requests)
    ids = []
    for request_id in ("one", "two"):
        requests.send(infer_request(request_id, TOKENS))
        while not final(response := (await call.read()).infer_response):
            ids.append(response.id)
    requests.close()
    assert await call.read() is aio.EOF
    assert ids == ["one"] * TOKENS + ["two"] * TOKENS
    side = stack.side
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    # one call, one record: both requests' tokens, under the model the stream named
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                      gen_ai_request_model="ensemble") == 2 * TOKENS  # fmt: skip
    assert side.value("llmobs_api_requests_total", api="triton-grpc") == 1


async def test_tritonclients_own_client_streams_through_the_sidecar(
    start_stack: StackFactory,
) -> None:
    """tritonclient's threaded client: its health and metadata calls, then a decoupled
    model's stream, as a Triton user's code makes them."""
    stack = await start_stack(model="ensemble")
    texts = await asyncio.to_thread(tritonclient_stream, stack.side.url.removeprefix("http://"), 6)
    assert len(texts) == 6
    side = stack.side
    await eventually(lambda: side.value("llmobs_api_requests_total", api="triton-grpc") == 1)
    await eventually(lambda: side.value("llmobs_tokens_total", gen_ai_token_type="output") == 6)
    assert side.value("llmobs_requests_total", gen_ai_request_model="ensemble",
                      outcome="ok") == 1  # fmt: skip


async def test_an_engine_the_sidecar_cannot_reach_is_a_grpc_status(
    start_sidecar: SidecarFactory,
) -> None:
    side = await start_sidecar(f"http://127.0.0.1:{free_port()}")
    async with aio.insecure_channel(side.url.removeprefix("http://"), options=LOCAL) as channel:
        with pytest.raises(aio.AioRpcError) as failed:
            await asyncio.wait_for(
                vllm_grpc.VllmEngineStub(channel).HealthCheck(vllm.HealthCheckRequest()), 10
            )
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert failed.value.details().startswith("llmobs: ")
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="upstream_error") == 1


async def test_an_engines_graceful_stop_lets_its_calls_end(start_stack: StackFactory) -> None:
    """The engine's GOAWAY (grpcio's ``server.stop(grace)``, a rollout's drain) ends no call
    in flight: the sidecar's engine leg lets each end, and takes no new one on it."""
    stack = await start_stack()
    call = VLLM.stub(stack.channel).Generate(VLLM.request("draining", TOKENS, True))
    first = await call.read()
    assert first.HasField("chunk")
    server = stack.server
    stopping = asyncio.ensure_future(server.stop(10))
    rest, _ = await _timed(call)
    await stopping
    assert await call.code() == grpc.StatusCode.OK
    assert sum(len(m.chunk.token_ids) for m in [first, *rest] if m.HasField("chunk")) == TOKENS
    side = stack.side
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="ok") == 1


async def test_the_sidecars_shutdown_ends_a_call_with_a_status(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """A call still streaming when the sidecar's grace runs out ends with UNAVAILABLE in its
    trailers (a status its client may retry on), soon after the grace, as a ``shutdown``."""
    sim = await start_sim(**{**SCHEDULE, "output_tokens_min": 100_000,
                             "output_tokens_max": 100_000})  # fmt: skip
    server, port = await start_grpc(sim.engine, "127.0.0.1", 0)
    side = await start_sidecar(f"http://127.0.0.1:{port}", shutdown_grace=0.3)
    try:
        async with aio.insecure_channel(side.url.removeprefix("http://"), options=LOCAL) as chan:
            call = VLLM.stub(chan).Generate(VLLM.request("long", 100_000, True))
            await call.read()
            loop = asyncio.get_running_loop()
            began = loop.time()
            stopping = asyncio.ensure_future(side.sidecar.stop())
            with contextlib.suppress(aio.AioRpcError):
                await _timed(call)
            assert await call.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in (await call.details())
            await stopping
            assert loop.time() - began < 4.0  # the grace and a margin, not the grace and 5 s
    finally:
        await server.stop(None)
    assert side.value("llmobs_requests_total", outcome="shutdown") == 1
