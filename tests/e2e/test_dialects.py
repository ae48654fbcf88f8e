"""Each dialect end to end: the simulated engine speaking it, the sidecar measuring it, and a
client timing it too. The sidecar's counts must equal the engine's, its TTFT the schedule's."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from llmobs.tools.traffic import Call, stream_call
from tests.support.servers import SidecarFactory, SimFactory, eventually

SCHEDULE: dict[str, Any] = {
    "max_batch": 4, "prefill_base": 0.1, "prefill_per_token": 0.0, "decode_base": 0.02,
    "decode_per_seq": 0.0, "output_tokens_min": 20, "output_tokens_max": 20,
}  # fmt: skip
# a stall only past this gap: far over a decode step, so that a token a loaded machine made
# late is not one (the stall's threshold itself: tests/unit/observe/test_stats.py)
STALL_MIN_GAP = 0.15
LATE = 0.075  # how late the loaded machine may make the first token
MESSAGES = [{"role": "user", "content": "hello there"}]
CALLS = {
    "openai-chat": Call("/v1/chat/completions", {"model": "m", "messages": MESSAGES,
                        "stream": True, "stream_options": {"include_usage": True}}),
    "openai-completions": Call("/v1/completions", {"model": "m", "prompt": "hi", "stream": True,
                               "stream_options": {"include_usage": True}}),
    "ollama-generate": Call("/api/generate", {"model": "m", "prompt": "hello"}),
    "ollama-chat": Call("/api/chat", {"model": "m", "messages": MESSAGES}),
    "tgi": Call("/generate_stream", {"inputs": "hello", "parameters": {"details": True}}),
    "anthropic": Call("/v1/messages", {"model": "m", "max_tokens": 100, "messages": MESSAGES,
                      "stream": True}),
    "responses": Call("/v1/responses", {"model": "m", "input": "hello", "stream": True}),
    "triton": Call("/v2/models/ensemble/generate_stream", {"text_input": "hello",
                   "max_tokens": 100, "return_num_output_tokens": True}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CALLS))
async def test_dialect_through_the_sidecar_matches_engine_and_client(
    name: str, start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    side = await start_sidecar(sim.url, stall_min_gap=STALL_MIN_GAP)
    async with aiohttp.ClientSession() as session:
        result = await stream_call(session, side.url, CALLS[name])
    assert result.ok, result
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    # Triton names no finish reason, and names its model in the path
    triton = {"gen_ai_request_model": "ensemble"} if name == "triton" else {}
    finish = "none" if triton else "stop"
    assert side.value("llmobs_requests_total", outcome="ok", finish_reason=finish, **triton) == 1
    # the engine's own count (TGI counts its EOS token too), as the client also read it
    expected = 21 if name == "tgi" else 20
    assert result.tokens == expected
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                      token_count_source="usage") == expected  # fmt: skip
    ttft = side.value("gen_ai_server_time_to_first_token_seconds_sum")
    assert 0.098 <= ttft <= 0.1 + LATE
    assert result.ttft is not None
    assert ttft <= result.ttft + 0.002  # the sidecar sees the first token no later than the client
    n = side.value("llmobs_inter_token_latency_seconds_count")
    mean = side.value("llmobs_inter_token_latency_seconds_sum") / n
    assert mean == pytest.approx(0.020, abs=0.004)
    assert side.value("llmobs_stalls_total") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0


async def test_n2_choices_are_timed_separately(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    side = await start_sidecar(sim.url)
    body = {"model": "m", "messages": MESSAGES, "n": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with (
        aiohttp.ClientSession() as s,
        s.post(side.url + "/v1/chat/completions", json=body) as r,
    ):
        await r.read()
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    # two choices of 20 tokens: 19 gaps each, each ~one 20 ms decode step (not 10 ms)
    n = side.value("llmobs_inter_token_latency_seconds_count")
    assert n == 38
    assert side.value("llmobs_inter_token_latency_seconds_sum") / n == pytest.approx(
        0.02, abs=0.004
    )
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output") == 40


async def test_reasoning_tokens_are_counted_from_usage(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    side = await start_sidecar(sim.url)
    body = {"model": "m", "messages": MESSAGES, "stream": True, "reasoning_effort": "low",
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with (
        aiohttp.ClientSession() as s,
        s.post(side.url + "/v1/chat/completions", json=body) as r,
    ):
        raw = await r.read()
    usage = next(json.loads(line[6:]) for line in raw.split(b"\n") if b'"choices":[]' in line)
    reasoning = usage["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert reasoning > 0
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_tokens_total", gen_ai_token_type="reasoning",
                      token_count_source="usage") == reasoning  # fmt: skip
