"""The sim's ``/v1/realtime`` (``sim.realtime``) as vLLM serves it: the session created on
connect, the model checked, a turn's deltas the engine's tokens and its done with the usage,
vLLM's error events for what is out of order, and a client's departure freeing the batch."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from llmobs.sim.realtime import FRAME_BYTES, TOKENS_PER_CHUNK
from tests.support.realtime import CHUNK
from tests.support.servers import SimFactory, eventually

FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
MODEL = "sim-llama-3-8b"


async def _send(ws: aiohttp.ClientWebSocketResponse, kind: str, **fields: Any) -> None:
    await ws.send_str(json.dumps({"type": kind, **fields}))


async def _next(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await ws.receive_str(timeout=10))
    return event


async def test_a_turn_as_vllm_answers_it(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST)
    async with http.ws_connect(sim.url + "/v1/realtime") as ws:
        assert (await _next(ws))["type"] == "session.created"
        await _send(ws, "session.update", model=MODEL)
        await _send(ws, "input_audio_buffer.commit")
        for _ in range(2):
            await _send(ws, "input_audio_buffer.append", audio=CHUNK)
        await _send(ws, "input_audio_buffer.commit", final=True)
        deltas = [await _next(ws) for _ in range(2 * TOKENS_PER_CHUNK)]
        done = await _next(ws)
    assert {d["type"] for d in deltas} == {"transcription.delta"}
    assert done["type"] == "transcription.done"
    assert done["text"] == "".join(d["delta"] for d in deltas)
    prompt = 2 * (3200 // FRAME_BYTES)
    assert done["usage"] == {"prompt_tokens": prompt, "completion_tokens": 4,
                             "total_tokens": prompt + 4}  # fmt: skip


async def test_what_is_out_of_order_is_an_error_event(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST)
    async with http.ws_connect(sim.url + "/v1/realtime") as ws:
        await _next(ws)
        await ws.send_str("{not json")
        await _send(ws, "input_audio_buffer.commit")  # before session.update
        await _send(ws, "session.update", model="another")
        await _send(ws, "input_audio_buffer.append", audio=CHUNK)  # no turn begun
        await _send(ws, "response.create")
        codes = [(await _next(ws))["code"] for _ in range(5)]
    assert codes == [
        "invalid_json", "model_not_validated", "not_found", "invalid_audio", "unknown_event",
    ]  # fmt: skip


async def test_a_client_gone_mid_turn_frees_its_place(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(prefill_base=0.001, prefill_per_token=0.0, decode_base=0.5)
    async with http.ws_connect(sim.url + "/v1/realtime") as ws:
        await _next(ws)
        await _send(ws, "session.update", model=MODEL)
        await _send(ws, "input_audio_buffer.commit")
        await _send(ws, "input_audio_buffer.append", audio=CHUNK)
        await _next(ws)  # the first delta: the chunk is running in the engine
        assert sim.engine.counters.running == 1
    await eventually(lambda: sim.engine.counters.running == 0)
    assert sim.engine.counters.cancelled == 1
