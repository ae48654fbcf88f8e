"""The sim in both roles of disaggregated prefill/decode (``sim.pd``, ``--pd-role``), over
loopback as a P/D routing proxy drives vLLM's NixlConnector: a prefill engine's answer to a
prefill leg, a decode engine's KV transfer and one-token prefill, malformed params served
locally, no role ignoring them, and a client gone during the transfer.

Times in the answers are the schedule's own (exact); times seen by the client are only bounded
from below, never from above beyond a generous margin, so that the tests hold on a loaded CI
machine."""

from __future__ import annotations

import asyncio
import math
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from llmobs.sim import SimEngine, SimSettings
from llmobs.sim.dialects.openai import request_metrics
from llmobs.sim.pd import (
    DECODE,
    NONE,
    PREFILL,
    KvSource,
    Leg,
    engine_id,
    kv_transfer_params,
    leg_of,
)
from llmobs.sim.request import EngineStopped, SimRequest
from tests.support.servers import SimFactory, eventually
from tests.support.sim_streams import FAST, collect, token_frames

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# what a P/D proxy adds to a prefill leg (vLLM's toy proxy, llm-d's sidecar)
PREFILL_LEG: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}  # fmt: skip
# what a prefill engine answered, as the proxy passes it on to the decode leg
DECODE_LEG: dict[str, Any] = {
    "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "sim-0",
    "remote_block_ids": [0, 1, 2], "remote_host": "127.0.0.1", "remote_port": 8000,
    "tp_size": 1,
}  # fmt: skip
# the decode engine's schedule: a KV transfer of 2 ms + 0.1 ms a token (200 tokens: 22 ms,
# 2000 tokens: 202 ms); a local prefill of 2000 tokens would take 410 ms, a decode leg's 10.2 ms
DECODER: dict[str, Any] = {
    "pd_role": DECODE, "per_request_metrics": True, "kv_transfer_base": 0.002,
    "kv_transfer_per_token": 0.0001, "prefill_base": 0.01, "prefill_per_token": 0.0002,
    "decode_base": 0.002, "output_tokens_min": 4, "output_tokens_max": 4,
}  # fmt: skip


def chat(prompt_chars: int, **extra: Any) -> dict[str, Any]:
    """A chat request of about ``prompt_chars / 4`` prompt tokens."""
    return {"messages": [{"role": "user", "content": "x" * prompt_chars}], **extra}


def transfer_s(settings: SimSettings, prompt_tokens: int) -> float:
    """The KV transfer the settings imply, in the engine's own arithmetic."""
    return settings.kv_transfer_base + settings.kv_transfer_per_token * prompt_tokens


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], request_id: str | None = None
) -> dict[str, Any]:
    headers = {"X-Request-Id": request_id} if request_id else None
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
    return answer


# --- the prefill engine ---------------------------------------------------------------------


@pytest.mark.parametrize(("path", "prompt"), [(CHAT, "messages"), (COMPLETIONS, "prompt")])
async def test_a_prefill_leg_is_answered_with_where_to_pull_its_kv_cache(
    start_sim: SimFactory, http: aiohttp.ClientSession, path: str, prompt: str
) -> None:
    sim = await start_sim(**FAST, pd_role=PREFILL)
    text = "y" * 170  # 43 prompt tokens: 3 blocks of 16
    body: dict[str, Any] = {"max_tokens": 1, "stream": False, "kv_transfer_params": PREFILL_LEG}
    body[prompt] = [{"role": "user", "content": text}] if prompt == "messages" else text
    answer = await post(http, sim.url + path, body, request_id="leg-1")

    assert answer["usage"]["completion_tokens"] == 1
    prompt_tokens = answer["usage"]["prompt_tokens"]
    params = answer["kv_transfer_params"]
    assert list(params) == [
        "do_remote_prefill", "do_remote_decode", "remote_engine_id", "remote_block_ids",
        "remote_host", "remote_port", "tp_size", "remote_request_id",
    ]  # fmt: skip
    served = urlsplit(sim.url)
    assert params == {
        "do_remote_prefill": True, "do_remote_decode": False,
        "remote_engine_id": engine_id(sim.settings.seed, served.port or 0),
        "remote_block_ids": list(range(math.ceil(prompt_tokens / 16))),
        "remote_host": served.hostname, "remote_port": served.port, "tp_size": 1,
        "remote_request_id": "leg-1",
    }  # fmt: skip
    assert params["remote_block_ids"] == [0, 1, 2]
    assert params["remote_engine_id"].startswith("sim-")

    again = await post(http, sim.url + path, body)  # no X-Request-Id
    assert again["kv_transfer_params"]["remote_request_id"] is None
    assert again["kv_transfer_params"]["remote_engine_id"] == params["remote_engine_id"]
    assert sim.engine.counters.prefill_legs == 2
    assert sim.engine.counters.kv_transfers == 0


async def test_each_prefill_engine_has_its_own_id(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sims = [await start_sim(**FAST, pd_role=PREFILL) for _ in range(2)]
    body = chat(40, max_tokens=1, kv_transfer_params=PREFILL_LEG)
    ids = [(await post(http, s.url + CHAT, body))["kv_transfer_params"] for s in sims]
    assert ids[0]["remote_engine_id"] != ids[1]["remote_engine_id"]
    assert ids[0]["remote_port"] != ids[1]["remote_port"]


async def test_a_prefill_leg_that_streams_is_streamed_as_any_request(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, pd_role=PREFILL)
    body = chat(40, max_tokens=1, stream=True, kv_transfer_params=PREFILL_LEG)
    frames = await collect(http, sim.url + CHAT, body)
    assert frames[-1].data == "[DONE]"
    assert len(token_frames("openai", frames)) == 1
    assert not any("kv_transfer_params" in f.data for f in frames[:-1])
    assert sim.engine.counters.prefill_legs == 0


@pytest.mark.parametrize(
    "params",
    [
        "x",
        [PREFILL_LEG],
        {**PREFILL_LEG, "do_remote_decode": "true"},
        {**PREFILL_LEG, "do_remote_decode": 1},
        DECODE_LEG,  # the other role's
    ],
)
async def test_a_prefill_engine_serves_anything_else_whole(
    start_sim: SimFactory, http: aiohttp.ClientSession, params: Any
) -> None:
    sim = await start_sim(**FAST, pd_role=PREFILL, output_tokens_min=5, output_tokens_max=5)
    answer = await post(http, sim.url + CHAT, chat(40, kv_transfer_params=params))
    assert "kv_transfer_params" not in answer
    assert answer["usage"]["completion_tokens"] == 5
    assert (sim.engine.counters.prefill_legs, sim.engine.counters.kv_transfers) == (0, 0)


# --- the decode engine ----------------------------------------------------------------------


async def test_a_decode_leg_waits_its_transfer_then_prefills_one_token(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**DECODER)
    step = DECODER["prefill_base"] + DECODER["prefill_per_token"] * 1
    seen: dict[int, float] = {}
    for chars in (800, 8000):  # 200 and 2000 prompt tokens
        body = chat(chars, kv_transfer_params=DECODE_LEG, stream=True,
                    stream_options={"include_usage": True})  # fmt: skip
        frames = await collect(http, sim.url + CHAT, body)
        last = frames[-2].data
        prompt_tokens = last["usage"]["prompt_tokens"]
        metrics = last["metrics"]
        waited = transfer_s(sim.settings, prompt_tokens)
        assert metrics["kv_transfer_ms"] == waited * 1000  # the engine's own truth, exactly
        assert metrics["queue_time_ms"] >= metrics["kv_transfer_ms"]
        assert metrics["queue_time_ms"] < metrics["kv_transfer_ms"] + 100  # idle engine
        assert metrics["time_to_first_token_ms"] == pytest.approx(step * 1000, abs=0.01)
        ttft = token_frames("openai", frames)[0].at
        assert ttft >= waited + step
        seen[prompt_tokens] = ttft
    assert sorted(seen) == [200, 2000]
    assert seen[2000] >= 0.202
    assert sim.engine.counters.kv_transfers == 2
    assert (sim.engine.counters.transferring, sim.engine.counters.waiting) == (0, 0)


async def test_a_request_without_params_is_prefilled_whole_on_a_decode_engine(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**DECODER)
    answer = await post(http, sim.url + CHAT, chat(8000))
    metrics = answer["metrics"]
    prefill = DECODER["prefill_base"] + DECODER["prefill_per_token"] * 2000
    assert answer["usage"]["prompt_tokens"] == 2000
    assert "kv_transfer_ms" not in metrics
    assert metrics["time_to_first_token_ms"] == pytest.approx(prefill * 1000, abs=0.01)
    assert metrics["queue_time_ms"] < 100
    assert sim.engine.counters.kv_transfers == 0


async def test_a_non_streamed_decode_leg_reports_its_transfer(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**DECODER)
    answer = await post(http, sim.url + COMPLETIONS,
                        {"prompt": "z" * 400, "kv_transfer_params": DECODE_LEG})  # fmt: skip
    waited = transfer_s(sim.settings, answer["usage"]["prompt_tokens"])
    assert answer["metrics"]["kv_transfer_ms"] == waited * 1000
    assert "kv_transfer_params" not in answer
    assert sim.engine.counters.completed == 1


@pytest.mark.parametrize(
    "params",
    [
        "x",
        None,
        [DECODE_LEG],
        {"do_remote_prefill": "yes"},
        {**DECODE_LEG, "do_remote_prefill": "yes"},
        {**DECODE_LEG, "do_remote_prefill": 1},
        {**DECODE_LEG, "remote_block_ids": 5},
        {**DECODE_LEG, "remote_block_ids": None},
        {**DECODE_LEG, "remote_engine_id": 7},
        {k: v for k, v in DECODE_LEG.items() if k != "remote_engine_id"},
        PREFILL_LEG,  # the other role's
    ],
)
async def test_malformed_params_are_served_as_a_local_request(
    start_sim: SimFactory, http: aiohttp.ClientSession, params: Any
) -> None:
    sim = await start_sim(**{**DECODER, "kv_transfer_base": 5.0})
    answer = await post(http, sim.url + CHAT, chat(400, kv_transfer_params=params))
    metrics = answer["metrics"]
    prefill = DECODER["prefill_base"] + DECODER["prefill_per_token"] * 100
    assert "kv_transfer_ms" not in metrics
    assert "kv_transfer_params" not in answer
    assert metrics["time_to_first_token_ms"] == pytest.approx(prefill * 1000, abs=0.01)
    assert metrics["queue_time_ms"] < 1000  # no 5 s transfer
    assert sim.engine.counters.kv_transfers == 0


async def test_without_a_role_the_params_are_ignored(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**{**DECODER, "pd_role": NONE, "kv_transfer_base": 5.0})
    loop = asyncio.get_running_loop()
    sent = loop.time()
    decode_leg = await post(http, sim.url + CHAT, chat(400, kv_transfer_params=DECODE_LEG))
    prefill_leg = await post(
        http, sim.url + CHAT, chat(400, max_tokens=1, kv_transfer_params=PREFILL_LEG)
    )
    assert loop.time() - sent < 2.5  # no 5 s transfer
    assert "kv_transfer_ms" not in decode_leg["metrics"]
    prefill = DECODER["prefill_base"] + DECODER["prefill_per_token"] * 100
    assert decode_leg["metrics"]["time_to_first_token_ms"] == pytest.approx(
        prefill * 1000, abs=0.01
    )
    assert "kv_transfer_params" not in prefill_leg
    counters = sim.engine.counters
    assert (counters.kv_transfers, counters.prefill_legs, counters.completed) == (0, 0, 2)


async def test_a_transfer_holds_no_place_in_the_batch(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    """One place in the batch: a local request is served whole while a decode leg pulls."""
    sim = await start_sim(**{**DECODER, "max_batch": 1, "kv_transfer_base": 0.5})
    pulling = asyncio.create_task(
        post(http, sim.url + CHAT, chat(40, kv_transfer_params=DECODE_LEG))
    )
    await eventually(lambda: sim.engine.counters.transferring == 1)
    assert (sim.engine.counters.waiting, sim.engine.counters.running) == (0, 0)
    local = await post(http, sim.url + CHAT, chat(40))
    assert sim.engine.counters.transferring == 1  # still pulling: it held no place
    assert "kv_transfer_ms" not in local["metrics"]
    answer = await pulling
    assert (
        answer["metrics"]["kv_transfer_ms"]
        == transfer_s(sim.settings, answer["usage"]["prompt_tokens"]) * 1000
    )
    assert (sim.engine.counters.completed, sim.engine.counters.kv_transfers) == (2, 1)


async def test_a_transfer_that_ends_mid_step_is_admitted_at_the_next(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    """The engine busy decoding another stream: the pulled request joins the batch at a step's
    end, never before its transfer ended, and its queue time still holds the transfer."""
    settings = {**DECODER, "decode_base": 0.013, "output_tokens_min": 60, "output_tokens_max": 60}
    sim = await start_sim(**settings)
    busy = asyncio.create_task(collect(http, sim.url + CHAT, chat(40, stream=True)))
    await eventually(lambda: sim.engine.counters.running == 1)
    answer = await post(
        http, sim.url + CHAT, chat(800, max_tokens=2, kv_transfer_params=DECODE_LEG)
    )
    assert sim.engine.counters.running == 1  # the other stream still decodes
    metrics = answer["metrics"]
    assert metrics["kv_transfer_ms"] == transfer_s(sim.settings, 200) * 1000
    assert metrics["queue_time_ms"] >= metrics["kv_transfer_ms"]
    assert metrics["queue_time_ms"] < metrics["kv_transfer_ms"] + 13 + 100  # one step, at most
    await busy
    assert (sim.engine.counters.completed, sim.engine.counters.kv_transfers) == (2, 1)


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_client_gone_during_the_transfer_drops_the_request(
    start_sim: SimFactory, http: aiohttp.ClientSession, streamed: bool
) -> None:
    sim = await start_sim(**{**DECODER, "kv_transfer_base": 10.0})
    counters = sim.engine.counters
    body = chat(40, kv_transfer_params=DECODE_LEG, stream=streamed)
    if streamed:
        async with http.post(sim.url + CHAT, json=body) as resp:
            assert resp.status == 200  # the head goes out at once; the tokens wait
            await eventually(lambda: counters.transferring == 1)
            resp.close()
    else:
        waiting = asyncio.create_task(post(http, sim.url + CHAT, body))
        await eventually(lambda: counters.transferring == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    await eventually(lambda: counters.cancelled == 1)
    assert (counters.transferring, counters.waiting, counters.running) == (0, 0, 0)
    assert (counters.kv_transfers, counters.completed) == (0, 0)

    answer = await post(http, sim.url + CHAT, chat(40))  # the engine serves on
    assert answer["metrics"]["queue_time_ms"] < 1000
    assert counters.completed == 1


async def test_an_engine_stopped_during_a_transfer_fails_the_request() -> None:
    engine = SimEngine(SimSettings(pd_role=DECODE, kv_transfer_base=10.0))
    engine.start()
    job = engine.submit(0, 100, decode_leg=True)
    assert (engine.counters.transferring, job.transfer_s) == (1, 10.0 + 0.00001 * 100)
    await engine.stop()
    with pytest.raises(EngineStopped):
        await job.next_token()
    assert engine.counters.transferring == 0


# --- the parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "role", "stream", "leg"),
    [
        (PREFILL_LEG, PREFILL, False, Leg.PREFILL),
        (PREFILL_LEG, PREFILL, True, Leg.LOCAL),
        (PREFILL_LEG, DECODE, False, Leg.LOCAL),
        (PREFILL_LEG, NONE, False, Leg.LOCAL),
        (DECODE_LEG, DECODE, False, Leg.DECODE),
        (DECODE_LEG, DECODE, True, Leg.DECODE),
        (DECODE_LEG, PREFILL, True, Leg.LOCAL),
        (DECODE_LEG, NONE, True, Leg.LOCAL),
        ({**DECODE_LEG, "remote_block_ids": []}, DECODE, True, Leg.DECODE),
        ({**DECODE_LEG, "remote_block_ids": (1,)}, DECODE, True, Leg.LOCAL),
        (None, DECODE, True, Leg.LOCAL),
    ],
)
def test_what_the_params_make_a_request(params: Any, role: str, stream: bool, leg: Leg) -> None:
    assert leg_of(params, role, stream) is leg


def test_blocks_are_counted_by_sixteen_and_ids_are_stable() -> None:
    source = KvSource("sim-x", "10.0.0.1", 8200)
    blocks = [len(kv_transfer_params(source, n, None)["remote_block_ids"]) for n in (1, 16, 17)]
    assert blocks == [1, 1, 2]
    assert engine_id(0, 8000) == engine_id(0, 8000)
    assert len({engine_id(0, 8000), engine_id(1, 8000), engine_id(0, 8001)}) == 3


def test_only_a_decode_leg_reports_its_transfer() -> None:
    job = SimRequest(seq=0, prompt_tokens=10, tokens=(" a",), finish_reason="stop")
    job.submitted_at, job.prefill_started_at, job.first_token_at, job.last_token_at = 1, 2, 3, 3
    assert "kv_transfer_ms" not in request_metrics([job])
    job.decode_leg, job.transfer_s = True, 0.5
    assert request_metrics([job]) == {
        "queue_time_ms": 1000, "time_to_first_token_ms": 1000, "generation_time_ms": 0,
        "kv_transfer_ms": 500,
    }  # fmt: skip
    assert (job.prefill_tokens, SimRequest(0, 10, (), "stop").prefill_tokens) == (1, 10)
