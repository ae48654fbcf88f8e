"""The sim's gRPC face (``sim.grpc_engine``) over loopback, with grpcio's own aio client and the
generated stubs: vLLM's, SGLang's and TensorRT-LLM's Generate, Triton's ModelStreamInfer (also
through tritonclient's own client), cancellation, Abort, errors, ``run_sim --grpc-port`` and
grpc.aio on uvloop."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import importlib
import queue
import re
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
import numpy as np
import pytest
import tritonclient.grpc as triton_client
import uvloop
from aiohttp import web
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
from tritonclient.grpc import service_pb2_grpc as kserve_grpc

from llmobs.config.options import ConfigError
from llmobs.sim import ENGINE_KEY, SimEngine, SimSettings, build_sim_app, run_sim
from llmobs.sim.dialects.base import count_prompt_tokens
from llmobs.sim.grpc_engine import start_grpc
from llmobs.sim.request import TOKENS, token_id
from tests.support.servers import SimFactory, eventually

FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
LONG = 100_000  # tokens a request asks for when it is to be ended before its last
PROMPT = [1, 2, 3, 4, 5]
VOCABULARY = {token_id(text) for text in TOKENS}
# a channel's connection its own, closed with it (not left in grpc's global pool, where the
# server's stop would cancel it: grpc logs that GOAWAY)
LOCAL = [("grpc.use_local_subchannel_pool", 1)]


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
APIS = [pytest.param(api, id=api.name) for api in (VLLM, SGLANG, TRTLLM)]


async def _responses(call: Any) -> list[Any]:
    """Every message of a server-streaming call, read one at a time."""
    out = []
    while (message := await call.read()) is not aio.EOF:
        out.append(message)
    return out


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("api", APIS)
async def test_a_streamed_generate_gives_max_tokens_in_cumulative_chunks(
    start_grpc_sim: GrpcSimFactory, api: Api, every: int
) -> None:
    sim = await start_grpc_sim(tokens_per_chunk=every, output_tokens_min=8, output_tokens_max=8)
    call = api.stub(sim.channel).Generate(api.request("r-1", 10, True))
    *chunks, last = [message for message in await _responses(call)]

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
    (only,) = await _responses(api.stub(sim.channel).Generate(api.request("r-2", 4, False)))
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
    messages = await _responses(VLLM.stub(sim.channel).Generate(request))
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
    *chunks, last = [first, *await _responses(call)]

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
    await _responses(stub.Generate(SGLANG.request("done", 2, True)))
    for request_id in ("done", "never"):
        answer = await stub.Abort(sglang.AbortRequest(request_id=request_id))
        assert not answer.success
    assert sim.engine.counters.cancelled == 0


async def test_an_injected_error_is_internal_and_counted(start_grpc_sim: GrpcSimFactory) -> None:
    sim = await start_grpc_sim(error_rate=1.0)
    with pytest.raises(aio.AioRpcError) as raised:
        await _responses(VLLM.stub(sim.channel).Generate(VLLM.request("e", 3, True)))
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert raised.value.details() == "simulated engine failure"
    assert sim.engine.counters.errors == 1


async def test_a_request_without_a_prompt_is_invalid(start_grpc_sim: GrpcSimFactory) -> None:
    sim = await start_grpc_sim()
    bad = vllm.GenerateRequest(request_id="b", sampling_params=vllm.SamplingParams(max_tokens=0))
    with pytest.raises(aio.AioRpcError) as raised:
        await _responses(VLLM.stub(sim.channel).Generate(bad))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sim.engine.counters.errors == 1


async def test_the_info_methods_describe_the_sims_model_and_load(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim(model="tiny", max_batch=4)
    stub = VLLM.stub(sim.channel)
    assert (await stub.HealthCheck(vllm.HealthCheckRequest())).healthy
    info = await stub.GetModelInfo(vllm.GetModelInfoRequest())
    assert (info.served_model_name, info.is_generation) == ("tiny", True)
    assert info.max_context_length > 0
    assert max(VOCABULARY) < info.vocab_size

    call = stub.Generate(VLLM.request("busy", LONG, True))
    await call.read()
    (load,) = (await stub.GetLoads(vllm.GetLoadsRequest())).loads
    assert (load.num_running_reqs, load.num_waiting_reqs, load.max_running_requests) == (1, 0, 4)
    assert (await stub.GetServerInfo(vllm.GetServerInfoRequest())).active_requests == 1
    call.cancel()

    assert (await SGLANG.stub(sim.channel).GetModelInfo(
        sglang.GetModelInfoRequest())).served_model_name == "tiny"  # fmt: skip
    trt = TRTLLM.stub(sim.channel)
    assert (await trt.HealthCheck(trtllm.HealthCheckRequest())).status == "OK"
    assert (await trt.GetModelInfo(trtllm.GetModelInfoRequest())).model_id == "tiny"
    with pytest.raises(aio.AioRpcError) as raised:
        await stub.Embed(vllm.EmbedRequest(request_id="x"))
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --- Triton -------------------------------------------------------------------------------


def _raw_bytes(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<I", len(data)) + data


def _infer_request(request_id: str, max_tokens: int, prompt: str = "Hello there") -> Any:
    """A ModelInferRequest as tritonclient makes one: every input in raw_input_contents."""
    tensor = kserve.ModelInferRequest.InferInputTensor
    inputs = [tensor(name="text_input", datatype="BYTES", shape=[1, 1]),
              tensor(name="max_tokens", datatype="INT32", shape=[1, 1]),
              tensor(name="stream", datatype="BOOL", shape=[1, 1])]  # fmt: skip
    raw = [_raw_bytes(prompt), struct.pack("<i", max_tokens), b"\x01"]
    return kserve.ModelInferRequest(
        model_name="ensemble", id=request_id, inputs=inputs, raw_input_contents=raw
    )


def _text(response: Any) -> str:
    """A response's text_output, read back from its raw BYTES tensor."""
    (raw,) = response.raw_output_contents
    (size,) = struct.unpack_from("<I", raw)
    assert len(raw) == 4 + size
    return bytes(raw[4:]).decode()


def _final(response: Any) -> bool:
    return bool(response.parameters["triton_final_response"].bool_param)


class _Requests:
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


async def test_triton_streams_a_text_output_per_token_then_an_empty_final_response(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim(output_tokens_min=64, output_tokens_max=64)
    requests = _Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(_infer_request("t-1", 5, "Say five words."))
    requests.close()
    *tokens, last = [m.infer_response for m in await _responses(call)]

    assert len(tokens) == 5
    assert all(_text(r).count(" ") == 1 for r in tokens)  # a token each: " word"
    assert all(not _final(r) and r.id == "t-1" and r.model_name == "ensemble" for r in tokens)
    assert _final(last) and last.id == "t-1" and not last.outputs
    assert sim.engine.counters.prompt_tokens == count_prompt_tokens("Say five words.")
    assert sim.engine.counters.completed == 1


async def test_overlapping_requests_on_one_triton_stream_complete_with_their_own_ids(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim(output_tokens_min=400, output_tokens_max=400)
    requests = _Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(_infer_request("long", 400))
    first = (await call.read()).infer_response
    requests.send(_infer_request("short", 3))  # while the long one runs
    requests.close()
    responses = [first, *[m.infer_response for m in await _responses(call)]]

    by_id: dict[str, list[Any]] = {"long": [], "short": []}
    for response in responses:
        by_id[response.id].append(response)
    for request_id, tokens in (("long", 400), ("short", 3)):
        *deltas, last = by_id[request_id]
        assert len(deltas) == tokens and _final(last), request_id
        assert not any(_final(r) for r in deltas)
    # served in parallel: the short one ended while the long one still ran
    ends = [r.id for r in responses if _final(r)]
    assert ends == ["short", "long"]
    assert sim.engine.counters.completed == 2


async def test_a_cancelled_triton_stream_cancels_its_requests(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    requests = _Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(_infer_request("a", LONG))
    requests.send(_infer_request("b", LONG))
    await eventually(lambda: sim.engine.counters.running == 2)
    await call.read()
    call.cancel()
    await eventually(lambda: sim.engine.counters.cancelled == 2)
    assert sim.engine.counters.running == sim.engine.counters.waiting == 0


async def test_a_refused_triton_request_is_an_error_message_on_a_stream_that_goes_on(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    requests = _Requests()
    call = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(kserve.ModelInferRequest(model_name="ensemble", id="bad"))  # no text_input
    requests.send(_infer_request("good", 2))
    requests.close()
    messages = await _responses(call)

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
    texts = await asyncio.to_thread(_tritonclient_stream, f"127.0.0.1:{sim.port}", 6)
    assert len(texts) == 6
    assert all(text.count(" ") == 1 for text in texts)
    assert sim.engine.counters.completed == 1


def _tritonclient_stream(url: str, max_tokens: int) -> list[str]:
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


async def test_an_engine_that_stops_ends_its_calls_unavailable(
    start_grpc_sim: GrpcSimFactory,
) -> None:
    sim = await start_grpc_sim()
    call = VLLM.stub(sim.channel).Generate(VLLM.request("v", LONG, True))
    await call.read()
    requests = _Requests()
    stream = kserve_grpc.GRPCInferenceServiceStub(sim.channel).ModelStreamInfer(requests)
    requests.send(_infer_request("t", LONG))
    await stream.read()
    await sim.engine.stop()
    for ended in (call, stream):
        with pytest.raises(aio.AioRpcError) as raised:
            await _responses(ended)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert raised.value.details() == "engine shutting down"


# --- run_sim, the option, the extra, uvloop -----------------------------------------------


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
        messages = await _responses(stub.Generate(VLLM.request("cli", 3, True)))
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


async def test_without_the_grpc_extra_the_option_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "llmobs.sim.grpc_engine")
    monkeypatch.setitem(sys.modules, "grpc", None)
    with pytest.raises(ImportError, match=r"need grpc: pip install 'llmobs\[grpc\]'"):
        importlib.import_module("llmobs.sim.grpc_engine")
    with pytest.raises(ConfigError) as raised:
        await run_sim(SimSettings(port=0, grpc_port=0))
    assert str(raised.value) == (
        "--grpc-port / LLMOBS_SIM_GRPC_PORT: the sim's gRPC APIs need grpc: "
        "pip install 'llmobs[grpc]'"
    )


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
                messages = await _responses(stub.Generate(VLLM.request("u", 5, True)))
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
