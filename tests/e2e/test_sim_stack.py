"""Through the sidecar to the simulated engine: timing against a known schedule, queueing,
cancellation, byte identity and the real OpenAI client. Bounds are generous: the schedule is
exact, the event loop's scheduling is not. The engine is never early, and a token a loaded
machine makes late lengthens its gap and shortens the next: the decode step is long enough,
and each bound loose enough, that one such token changes no verdict."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

CHAT = "/v1/chat/completions"
# prefill 100 ms, then one token every 50 ms, 20 tokens, one request at a time
SCHEDULE: dict[str, Any] = {
    "max_batch": 1, "prefill_base": 0.1, "prefill_per_token": 0.0, "decode_base": 0.05,
    "decode_per_seq": 0.0, "output_tokens_min": 20, "output_tokens_max": 20,
}  # fmt: skip
LATE = 0.075  # how late the busy machine may make the first token


def chat(stream: bool = True, **extra: Any) -> dict[str, Any]:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hello there"}]}
    return {**body, "stream": stream, **extra}


async def post(url: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(url + CHAT, json=body) as r:
        assert r.status == 200
        return await r.read()


def single(side: SidecarHandle, family: str) -> float:
    """The value of a histogram that holds exactly one observation: its sum."""
    assert side.value(family + "_count") == 1
    return side.value(family + "_sum")


async def test_ttft_itl_tpot_match_the_engine_schedule(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    side = await start_sidecar(sim.url)
    await post(side.url, chat())
    ttft = single(side, "gen_ai_server_time_to_first_token_seconds")
    tpot = single(side, "gen_ai_server_time_per_output_token_seconds")
    assert 0.098 <= ttft <= 0.1 + LATE
    # from the first token to the last: only a late first or last token moves these
    assert tpot == pytest.approx(0.050, abs=0.005)
    itl_n = side.value("llmobs_inter_token_latency_seconds_count")
    itl_sum = side.value("llmobs_inter_token_latency_seconds_sum")
    assert itl_n == 19
    assert itl_sum / itl_n == pytest.approx(0.050, abs=0.005)
    # 19 gaps of ~50 ms: in the 50 ms bucket's neighbours, but for a few late tokens' (each
    # makes one gap long and the next short)
    assert side.value("llmobs_inter_token_latency_seconds_bucket", le="0.075") >= 19 - 5
    assert side.value("llmobs_inter_token_latency_seconds_bucket", le="0.04") <= 5
    assert side.value("llmobs_stalls_total") == 0
    assert single(side, "llmobs_smoothness") > 0.9
    assert side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == 20


@pytest.mark.parametrize(
    ("options", "itl_count"),
    [
        # chunks carry 1, 3, 3, 3, 3, 3, 3, 2 tokens (the first token alone, as vLLM does)
        # final usage: the first chunk keeps its 1, the other 20 spread as 3,3,3,3,3,3,2
        ({"include_usage": True}, 20),
        ({"include_usage": True, "continuous_usage_stats": True}, 20),  # exact per chunk
        ({}, 7),  # no usage at all: one token per chunk
    ],
)
async def test_multi_token_chunks_count_itl_per_token(
    start_sim: SimFactory,
    start_sidecar: SidecarFactory,
    options: dict[str, bool],
    itl_count: int,
) -> None:
    sim = await start_sim(**{**SCHEDULE, "tokens_per_chunk": 3, "output_tokens_min": 21,
                             "output_tokens_max": 21})  # fmt: skip
    side = await start_sidecar(sim.url)
    await post(side.url, chat(stream_options=options))
    n = side.value("llmobs_inter_token_latency_seconds_count")
    mean = side.value("llmobs_inter_token_latency_seconds_sum") / n
    assert n == itl_count
    # 1 s (20 steps) from the first to the last chunk, shared by the tokens after the first
    assert mean * n == pytest.approx(1.0, abs=0.05)
    output = side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output")
    assert output == (8 if not options else 21)


async def test_stalls_and_smoothness_steady_versus_paused(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    steady_sim = await start_sim(**{**SCHEDULE, "output_tokens_min": 40, "output_tokens_max": 40})
    paused_sim = await start_sim(**{**SCHEDULE, "output_tokens_min": 40, "output_tokens_max": 40,
                                    "stall_every": 10, "stall_ms": 300.0})  # fmt: skip
    steady = await start_sidecar(steady_sim.url)
    paused = await start_sidecar(paused_sim.url)
    await asyncio.gather(post(steady.url, chat()), post(paused.url, chat()))
    assert steady.value("llmobs_stalls_total") == 0
    assert 3 <= paused.value("llmobs_stalls_total") <= 4
    assert single(steady, "llmobs_smoothness") > 0.9
    assert single(paused, "llmobs_smoothness") < 0.6


async def test_prefill_queue_depth_rises_to_n_and_returns_to_zero(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**{**SCHEDULE, "prefill_base": 0.3, "output_tokens_min": 5,
                             "output_tokens_max": 5})  # fmt: skip
    side = await start_sidecar(sim.url)
    n = 4
    seen: list[tuple[float, float]] = []  # (when, depth)
    loop = asyncio.get_running_loop()
    requests = asyncio.gather(*(post(side.url, chat()) for _ in range(n)))
    while not requests.done():
        seen.append((loop.time(), side.value("llmobs_prefill_queue_depth")))
        await asyncio.sleep(0.01)
    await requests
    assert max(depth for _, depth in seen) == n
    # held through the first 300 ms prefill, not a blip (however seldom a loaded loop samples)
    full = [t for t, depth in seen if depth == n]
    assert full[-1] - full[0] >= 0.1, seen
    assert side.value("llmobs_prefill_queue_depth") == 0
    # later requests waited behind earlier ones: TTFTs ~0.3, 0.8, 1.3, 1.8 s
    assert side.value("gen_ai_server_time_to_first_token_seconds_bucket", le="0.5") == 1
    assert side.value("gen_ai_server_time_to_first_token_seconds_bucket", le="1.0") == 2
    assert side.value("gen_ai_server_time_to_first_token_seconds_count") == n


async def test_client_disconnect_reaches_the_engine(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**{**SCHEDULE, "output_tokens_min": 200, "output_tokens_max": 200})
    side = await start_sidecar(sim.url)
    async with aiohttp.ClientSession() as s, s.post(side.url + CHAT, json=chat()) as r:
        for _ in range(3):
            await r.content.readline()
    await eventually(lambda: sim.engine.counters.cancelled == 1)
    assert sim.engine.counters.running == 0
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1
    assert side.value("llmobs_requests_active") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0


def _mask(body: bytes) -> bytes:
    """Ids and timestamps differ between two requests; everything else must not."""
    body = re.sub(rb'"id":"[a-z]+-[0-9a-f]+"', b'"id":"X"', body)
    return re.sub(rb'"created":\d+', b'"created":0', body)


@pytest.mark.parametrize("stream", [True, False])
async def test_sim_bytes_through_sidecar_equal_direct(
    start_sim: SimFactory, start_sidecar: SidecarFactory, stream: bool
) -> None:
    sim = await start_sim(decode_base=0.002, prefill_base=0.001)
    side = await start_sidecar(sim.url)
    body = chat(stream, seed=42, max_tokens=50, stream_options={"include_usage": True})
    if not stream:
        del body["stream_options"]
    direct = await post(sim.url, body)
    proxied = await post(side.url, body)
    assert len(proxied) == len(direct) > 200
    assert _mask(proxied) == _mask(direct)


async def test_openai_client_streams_through_the_sidecar(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(decode_base=0.005, prefill_base=0.01)
    side = await start_sidecar(sim.url)
    async with AsyncOpenAI(base_url=side.url + "/v1", api_key="sk-test", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=30,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
        completion = await client.completions.create(model="sim", prompt="hi", max_tokens=10)
    assert usage is not None
    assert len(text.split()) == usage.completion_tokens
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 10
    assert side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == (
        usage.completion_tokens + 10
    )
    assert side.value("llmobs_requests_total", gen_ai_operation_name="chat",
                      gen_ai_request_model="sim", outcome="ok") == 1  # fmt: skip
    assert side.value("llmobs_requests_total", gen_ai_operation_name="text_completion") == 1


async def test_disconnect_during_prefill_reaches_the_engine_and_empties_the_queue(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**{**SCHEDULE, "prefill_base": 1.0})
    side = await start_sidecar(sim.url)
    async with aiohttp.ClientSession() as s:
        response = await s.post(side.url + CHAT, json=chat())  # headers come back at once
        await eventually(lambda: side.value("llmobs_prefill_queue_depth") == 1)
        response.close()  # the client gives up while the engine is still in prefill
    await eventually(lambda: sim.engine.counters.cancelled == 1)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1
    assert side.value("llmobs_prefill_queue_depth") == 0
    assert side.value("gen_ai_server_time_to_first_token_seconds_count") == 0


async def test_hugging_face_inference_client_posts_to_the_root_as_tgi(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """``InferenceClient(model=<server URL>)`` posts TGI's bodies to ``/`` (TGI's compat
    route): streamed and not, they are measured as TGI text completions, with the engine's
    counts (input tokens from the stream's ``details.input_length``); a POST to ``/`` that is
    not TGI's stays unknown."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    sim = await start_sim(dialect="tgi", decode_base=0.003, prefill_base=0.005)
    side = await start_sidecar(sim.url)

    def generate() -> tuple[list[Any], Any]:
        client = huggingface_hub.InferenceClient(model=side.url)
        events = list(client.text_generation("What is deep learning?", max_new_tokens=12,
                                             stream=True, details=True))  # fmt: skip
        whole = client.text_generation("What is deep learning?", max_new_tokens=7, details=True)
        return events, whole

    events, whole = await asyncio.to_thread(generate)
    final = events[-1].details
    assert final is not None and whole.details is not None
    await eventually(lambda: side.value("llmobs_requests_total") == 2)
    assert side.value("llmobs_requests_total", gen_ai_operation_name="text_completion") == 2
    output = side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output")
    assert output == final.generated_tokens + whole.details.generated_tokens
    assert side.value("gen_ai_client_token_usage_count", gen_ai_token_type="input") == 1
    assert side.value("llmobs_inter_token_latency_seconds_count") >= 10  # timed per token
    async with (
        aiohttp.ClientSession() as session,
        session.post(side.url + "/", json={"hello": "world"}) as r,
    ):
        await r.read()
    await eventually(lambda: side.value("llmobs_requests_total") == 3)
    assert side.value("llmobs_requests_total", gen_ai_operation_name="other") == 1
