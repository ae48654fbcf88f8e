"""The sim's gRPC face (``sim.grpc_engine``) over loopback, with grpcio's own aio client and the
generated stubs: vLLM's, SGLang's and TensorRT-LLM's Generate, Triton's ModelStreamInfer (also
through tritonclient's own client), cancellation, Abort, errors, ``run_sim --grpc-port`` and
grpc.aio on uvloop."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import re
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
import pytest
import uvloop
from aiohttp import web
from grpc import aio  # type: ignore[import-untyped, unused-ignore]
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
from tritonclient.grpc import service_pb2_grpc as kserve_grpc

from llmobs.config.options import ConfigError
from llmobs.sim import ENGINE_KEY, SimEngine, SimSettings, build_sim_app, run_sim
from llmobs.sim.dialects.base import count_prompt_tokens
from llmobs.sim.grpc_engine import start_grpc
from llmobs.sim.request import TOKENS, token_id
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
    responses,
    tritonclient_stream,
)
from tests.support.servers import SimFactory, eventually

FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
LONG = 100_000  # tokens a request asks for when it is to be ended before its last
VOCABULARY = {token_id(text) for text in TOKENS}


@dataclass
class GrpcSim:
    engine: SimEngine
    channel: Any  # grpc.aio.Channel
    port: int


GrpcSimFactory = Callable[..., Awaitable[GrpcSim]]


@pytest.fixture
async def start_grpc_sim(start_sim: SimFactory) -> AsyncIterator[GrpcSimFactory]:
    """A sim with its gRPC face on an ephemeral loopback port, and a channel to it."""
    started: list[tuple[Any, Any]] = []

    async def start(**overrides: Any) -> GrpcSim:
        sim = await start_sim(**{**FAST, **overrides})
        server, port = await start_grpc(sim.engine, "127.0.0.1", 0)
        channel = aio.insecure_channel(f"127.0.0.1:{port}", options=LOCAL)
        started.append((server, channel))
        return GrpcSim(sim.engine, channel, port)

    yield start
    for server, channel in started:
        await channel.close()
        await server.stop(None)


APIS = [pytest.param(api, id=api.name) for api in (VLLM, SGLANG, TRTLLM)]


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("api", APIS)
async def test_a_streamed_generate_gives_max_tokens_in_cumulative_chunks(
    start_grpc_sim: GrpcSimFactory, api: Api, every: int
) -> None:
    sim = await start_grpc_sim(tokens_per_chunk=every, output_tokens_min=8, output_tokens_max=8)
    call = api.stub(sim.channel).Generate(api.request("r-1", 10, True))
    *chunks, last = [message for message in await responses(call)]

    sizes = [len(m.chunk.token_ids) for m in chunks]
    assert sizes == ([1] * 10 if every == 1 else [1, 3, 3, 3])  # the first alone, then `every`
    assert [m.chunk.completion_tokens for m in chunks] == [sum(sizes[: i + 1]) for i in
                                                           range(len(sizes))]  # fmt: skip
    assert {m.chunk.prompt_tokens for m in chunks} == {len(PROMPT)}
    ids = [i for m in chunks for i in m.chunk.token_ids]
    assert set(ids) <= VOCABULARY
    complete = last.complete
    assert complete.finish_reason == "length"  # ignore_eos: exactly max tokens, past the model's 8
    assert api.output_ids(complete) == ids
    assert (complete.prompt_tokens, complete.completion_tokens) == (len(PROMPT), 10)
    if api.echoes:
        assert {m.request_id for m in (*chunks, last)} == {"r-1"}
    assert sim.engine.counters.completed == 1
    assert sim.engine.counters.generation_tokens == 10


@pytest.mark.parametrize("api", APIS)
async def test_an_unstreamed_generate_is_the_complete_message_alone(
    start_grpc_sim: GrpcSimFactory, api: Api
) -> None:
    sim = await start_grpc_sim()
    (only,) = await responses(api.stub(sim.channel).Generate(api.request("r-2", 4, False)))
    assert only.WhichOneof("response") == "complete"
    assert len(api.output_ids(only.complete)) == only.complete.completion_tokens == 4


async def test_a_vllm_text_prompt_is_counted_as_the_http_dialects_count_one(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    text = "Say something about the weather, briefly."
    request = vllm.GenerateRequest(
        request_id="t", text=text, sampling_params=vllm.SamplingParams(max_tokens=2), stream=True
    )
    messages = await responses(VLLM.stub(sim.channel).Generate(request))
    assert messages[-1].complete.prompt_tokens == count_prompt_tokens(text)
    assert sim.engine.counters.prompt_tokens == count_prompt_tokens(text)


@pytest.mark.parametrize("api", APIS)
async def test_a_cancelled_call_cancels_its_request_in_the_engine(
    start_grpc_sim: GrpcSimFactory, api: Api
) -> None:
    sim = await start_grpc_sim()
    call = api.stub(sim.channel).Generate(api.request("gone", LONG, True))
    assert (await call.read()).chunk.completion_tokens == 1
    call.cancel()
    await eventually(lambda: sim.engine.counters.cancelled == 1)
    assert sim.engine.counters.running == sim.engine.counters.waiting == 0
    assert sim.engine.counters.completed == 0


@pytest.mark.parametrize("api", APIS)
async def test_abort_ends_the_named_request_as_abort(
    start_grpc_sim: GrpcSimFactory, api: Api
) -> None:
    sim = await start_grpc_sim()
    stub = api.stub(sim.channel)
    call = stub.Generate(api.request("victim", LONG, True))
    first = await call.read()
    await stub.Abort(api.abort("victim"))
    *chunks, last = [first, *await responses(call)]

    assert last.complete.finish_reason == "abort"
    sent = [i for m in chunks for i in m.chunk.token_ids]
    assert api.output_ids(last.complete) == sent
    assert last.complete.completion_tokens == len(sent) < LONG
    assert sim.engine.counters.cancelled == 1
    assert sim.engine.counters.running == 0
    assert sim.engine.counters.errors == 0


async def test_abort_of_an_unknown_or_finished_request_changes_nothing(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    stub = SGLANG.stub(sim.channel)
    await responses(stub.Generate(SGLANG.request("done", 2, True)))
    for request_id in ("done", "never"):
        answer = await stub.Abort(sglang.AbortRequest(request_id=request_id))
        assert not answer.success
    assert sim.engine.counters.cancelled == 0


async def test_an_injected_error_is_internal_and_counted(start_grpc_sim: GrpcSimFactory) -> None:
    sim = await start_grpc_sim(error_rate=1.0)
    with pytest.raises(aio.AioRpcError) as raised:
        await responses(VLLM.stub(sim.channel).Generate(VLLM.request("e", 3, True)))
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert raised.value.details() == "simulated engine failure"
    assert sim.engine.counters.errors == 1


async def test_a_request_without_a_prompt_is_invalid(start_grpc_sim: GrpcSimFactory) -> None:
    sim = await start_grpc_sim()
    bad = vllm.GenerateRequest(request_id="b", sampling_params=vllm.SamplingParams(max_tokens=0))
    with pytest.raises(aio.AioRpcError) as raised:
        await responses(VLLM.stub(sim.channel).Generate(bad))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sim.engine.counters.errors == 1


async def test_the_info_methods_describe_the_sims_model_and_load(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim(model="tiny", max_batch=4, tokenizer_path="/models/tiny")
    stub = VLLM.stub(sim.channel)
    assert (await stub.HealthCheck(vllm.HealthCheckRequest())).healthy
    info = await stub.GetModelInfo(vllm.GetModelInfoRequest())
    assert (info.served_model_name, info.is_generation) == ("tiny", True)
    assert info.tokenizer_path == "/models/tiny"  # where a gateway loads the tokenizer from
    assert info.max_context_length > 0
    assert max(VOCABULARY) < info.vocab_size

    call = stub.Generate(VLLM.request("busy", LONG, True))
    await call.read()
    (load,) = (await stub.GetLoads(vllm.GetLoadsRequest())).loads
    assert (load.num_running_reqs, load.num_waiting_reqs, load.max_running_requests) == (1, 0, 4)
    assert (await stub.GetServerInfo(vllm.GetServerInfoRequest())).active_requests == 1
    call.cancel()

    sglang_info = await SGLANG.stub(sim.channel).GetModelInfo(sglang.GetModelInfoRequest())
    assert (sglang_info.served_model_name, sglang_info.tokenizer_path) == ("tiny", "/models/tiny")
    trt = TRTLLM.stub(sim.channel)
    assert (await trt.HealthCheck(trtllm.HealthCheckRequest())).status == "OK"
    assert (await trt.GetModelInfo(trtllm.GetModelInfoRequest())).model_id == "tiny"
    with pytest.raises(aio.AioRpcError) as raised:
        await stub.Embed(vllm.EmbedRequest(request_id="x"))
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --- Triton -------------------------------------------------------------------------------


def _text(response: Any) -> str:
    """A response's text_output, read back from its raw BYTES tensor."""
    (raw,) = response.raw_output_contents
    (size,) = struct.unpack_from("<I", raw)
    assert len(raw) == 4 + size
    return bytes(raw[4:]).decode()


async def test_triton_streams_a_text_output_per_token_then_an_empty_final_response(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim(output_tokens_min=64, output_tokens_max=64)
    requests = Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(infer_request("t-1", 5, "Say five words."))
    requests.close()
    *tokens, last = [m.infer_response for m in await responses(call)]

    assert len(tokens) == 5
    assert all(_text(r).count(" ") == 1 for r in tokens)  # a token each: " word"
    assert all(not final(r) and r.id == "t-1" and r.model_name == "ensemble" for r in tokens)
    assert final(last) and last.id == "t-1" and not last.outputs
    assert sim.engine.counters.prompt_tokens == count_prompt_tokens("Say five words.")
    assert sim.engine.counters.completed == 1


async def test_overlapping_requests_on_one_triton_stream_complete_with_their_own_ids(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    """A short request sent while a long one runs on the same stream ends first, with its
    own id: they are served in parallel. (The long one is far longer than any test runs:
    the order does not depend on how fast the machine is.)"""
    sim = await start_grpc_sim(output_tokens_min=LONG, output_tokens_max=LONG)
    requests = Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(infer_request("long", LONG))
    answers = [(await call.read()).infer_response]
    requests.send(infer_request("short", 3))  # while the long one runs
    while not (answers[-1].id == "short" and final(answers[-1])):
        answers.append((await call.read()).infer_response)
    call.cancel()
    by_id: dict[str, list[Any]] = {"long": [], "short": []}
    for response in answers:
        by_id[response.id].append(response)
    *deltas, last = by_id["short"]
    assert len(deltas) == 3 and final(last) and not any(final(r) for r in deltas)
    assert by_id["long"] and not any(final(r) for r in by_id["long"])
    await eventually(lambda: sim.engine.counters.cancelled == 1)  # the long one, with its call
    assert sim.engine.counters.completed == 1


async def test_a_cancelled_triton_stream_cancels_its_requests(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    requests = Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(infer_request("a", LONG))
    requests.send(infer_request("b", LONG))
    await eventually(lambda: sim.engine.counters.running == 2)
    await call.read()
    call.cancel()
    await eventually(lambda: sim.engine.counters.cancelled == 2)
    assert sim.engine.counters.running == sim.engine.counters.waiting == 0


async def test_a_refused_triton_request_is_an_error_message_on_a_stream_that_goes_on(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    requests = Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(kserve.ModelInferRequest(model_name="ensemble", id="bad"))  # no text_input
    requests.send(infer_request("good", 2))
    requests.close()
    messages = await responses(call)

    assert "'text_input' is required" in messages[0].error_message
    assert messages[0].infer_response.id == "bad"
    assert [m.infer_response.id for m in messages[1:]] == ["good"] * 3
    assert sim.engine.counters.errors == 1


async def test_triton_model_infer_answers_whole_and_reads_typed_contents(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim(output_tokens_min=64, output_tokens_max=64)
    contents = kserve.InferTensorContents
    tensor = kserve.ModelInferRequest.InferInputTensor
    inputs = [
        tensor(name="text_input", datatype="BYTES", shape=[1, 1],
               contents=contents(bytes_contents=[b"Hi"])),
        tensor(name="max_tokens", datatype="INT64", shape=[1, 1],
               contents=contents(int64_contents=[3])),
        tensor(name="exclude_input_in_output", datatype="BOOL", shape=[1, 1],
               contents=contents(bool_contents=[True])),
    ]  # fmt: skip
    request = kserve.ModelInferRequest(model_name="ensemble", id="u", inputs=inputs)
    answer = await kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelInfer(request)
    assert answer.id == "u"
    assert _text(answer).count(" ") == 3 and not _text(answer).startswith("Hi")


async def test_tritonclients_own_client_streams_from_the_sim(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim(output_tokens_min=64, output_tokens_max=64, model="ensemble")
    texts = await asyncio.to_thread(tritonclient_stream, f"127.0.0.1:{sim.port}", 6)
    assert len(texts) == 6
    assert all(text.count(" ") == 1 for text in texts)
    assert sim.engine.counters.completed == 1


async def test_an_engine_that_stops_ends_its_calls_unavailable(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    call = VLLM.stub(sim.channel).Generate(VLLM.request("v", LONG, True))
    await call.read()
    requests = Requests()
    stream = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(infer_request("t", LONG))
    await stream.read()
    await sim.engine.stop()
    for ended in (call, stream):
        with pytest.raises(aio.AioRpcError) as raised:
            await responses(ended)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert raised.value.details() == "engine shutting down"


# --- run_sim, the option, uvloop -----------------------------------------------


async def test_run_sim_serves_grpc_on_the_port_it_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    task = asyncio.create_task(run_sim(SimSettings(port=0, grpc_port=0, **FAST)))
    printed: list[str] = []

    def both_lines() -> bool:
        printed.append(capsys.readouterr().out)
        return "".join(printed).count("\n") >= 2

    await eventually(both_lines)
    listening, serving = "".join(printed).splitlines()[:2]
    assert listening.startswith("llmobs sim: listening on http://127.0.0.1:")
    match = re.fullmatch(r"llmobs sim: gRPC on 127\.0\.0\.1:(\d+)", serving)
    assert match is not None
    async with aio.insecure_channel(f"127.0.0.1:{match.group(1)}", options=LOCAL) as channel:
        stub = VLLM.stub(channel)
        assert (await stub.HealthCheck(vllm.HealthCheckRequest())).healthy
        messages = await responses(stub.Generate(VLLM.request("cli", 3, True)))
        assert messages[-1].complete.completion_tokens == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_taken_grpc_port_is_told_as_in_use(start_grpc_sim: GrpcSimFactory) -> None:
    sim = await start_grpc_sim()  # grpc's SO_REUSEPORT off: no second server shares the port
    with pytest.raises(OSError, match="in use") as raised:
        await start_grpc(sim.engine, "127.0.0.1", sim.port)
    assert raised.value.errno == errno.EADDRINUSE


def test_the_grpc_port_option() -> None:
    assert SimSettings().grpc_port is None
    assert SimSettings.from_sources({"LLMOBS_SIM_GRPC_PORT": "0"}).grpc_port == 0
    assert SimSettings.from_sources({}, {"grpc_port": "50051"}).grpc_port == 50051
    with pytest.raises(ConfigError, match="--grpc-port / LLMOBS_SIM_GRPC_PORT"):
        SimSettings.from_sources({"LLMOBS_SIM_GRPC_PORT": "70000"})


def test_grpc_aio_serves_and_cancels_on_uvloop() -> None:
    async def scenario() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        app = build_sim_app(dataclasses.replace(SimSettings(), **FAST))
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        engine = app[ENGINE_KEY]
        server, port = await start_grpc(engine, "127.0.0.1", 0)
        try:
            async with aio.insecure_channel(f"127.0.0.1:{port}", options=LOCAL) as channel:
                stub = VLLM.stub(channel)
                messages = await responses(stub.Generate(VLLM.request("u", 5, True)))
                assert messages[-1].complete.finish_reason == "length"
                call = stub.Generate(VLLM.request("c", LONG, True))
                await call.read()
                call.cancel()
                await eventually(lambda: engine.counters.cancelled == 1)
        finally:
            await server.stop(None)
            await runner.cleanup()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
