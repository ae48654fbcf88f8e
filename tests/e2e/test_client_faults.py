"""Client faults: disconnects at every phase, slowloris, invalid bodies, pipelining, and the
mass cancellation of hundreds of streams. Cancellation must always reach the engine, gauges
must come back to 0, every request must have exactly one outcome, nothing may leak."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from llmobs.sim import SimEngine
from tests.support.leaks import Usage, back_to
from tests.support.rawhttp import read_response
from tests.support.scripted import ScriptedUpstream
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

CHAT = "/v1/chat/completions"
QUIET: dict[str, Any] = {"engine_scrape_interval": 0, "gpu_sample_interval": 0}
STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def port_of(side: SidecarHandle) -> int:
    return int(side.url.rsplit(":", 1)[1])


async def stream_until_cancelled(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(url + CHAT, json=STREAM) as r:
        async for _ in r.content.iter_any():
            pass


def engine_idle(engine: SimEngine) -> bool:
    return engine.counters.waiting == 0 and engine.counters.running == 0


# phase: (sim settings, when the client leaves)
PHASES: dict[str, tuple[dict[str, Any], Callable[[SimEngine], bool]]] = {
    "upload": ({}, lambda e: True),  # body still on its way: the sidecar holds the request
    "queued": ({"max_batch": 1}, lambda e: e.counters.waiting == 1),  # behind a full batch
    "prefill": ({"prefill_base": 2.0}, lambda e: e.counters.running == 1),  # no token yet
    "decode": ({}, lambda e: e.counters.generation_tokens >= 3),  # tokens flowing
}


@pytest.mark.parametrize("phase", list(PHASES))
async def test_disconnect_at_every_phase_reaches_the_engine(
    start_sim: SimFactory, start_sidecar: SidecarFactory, phase: str
) -> None:
    overrides, leave_when = PHASES[phase]
    sim = await start_sim(output_tokens_min=500, output_tokens_max=500, **overrides)
    side = await start_sidecar(sim.url, **QUIET)
    baseline = Usage.now()
    blocker = None
    if phase == "queued":  # a direct request holds the only batch slot
        direct = aiohttp.ClientSession()
        blocker = asyncio.ensure_future(stream_until_cancelled(direct, sim.url))
        await eventually(lambda: sim.engine.counters.running == 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(side))
    body = json.dumps({**STREAM, "max_tokens": 500}).encode()
    length = len(body) + (100 if phase == "upload" else 0)  # "upload": never finished
    writer.write(
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
        + body
    )
    await eventually(lambda: leave_when(sim.engine))
    await eventually(lambda: side.value("llmobs_requests_active") == 1)
    writer.transport.abort()  # the client is gone, at once

    submitted = phase != "upload"
    if not submitted:  # the body is read whole before it goes upstream (as nginx buffers it)
        assert sim.engine.counters.requests_received == 0
    await eventually(lambda: sim.engine.counters.cancelled == int(submitted))  # the engine knows
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == 1
    assert side.value("llmobs_requests_active") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0
    if blocker is not None:
        blocker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await blocker
        await direct.close()
    await eventually(lambda: engine_idle(sim.engine))
    assert sim.engine.counters.completed == 0
    del reader
    await back_to(baseline)


async def test_slowloris_headers_are_cut_after_the_client_timeout(
    start_app: Callable[..., Awaitable[str]], start_sidecar: SidecarFactory
) -> None:
    upstream = ScriptedUpstream()
    side = await start_sidecar(await start_app(upstream.app()), client_timeout=1.0, **QUIET)
    baseline = Usage.now()
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(side))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60
    closed = False
    for byte in head:  # one byte every 0.1 s: 9 s in all, unless the sidecar hangs up
        try:
            writer.write(bytes([byte]))
            await writer.drain()
            if reader.at_eof() or writer.is_closing():
                closed = True
                break
            with contextlib.suppress(TimeoutError):
                closed = await asyncio.wait_for(reader.read(1), 0.1) == b""
            if closed:
                break
        except ConnectionError:
            closed = True
            break
    elapsed = loop.time() - started
    writer.close()
    assert closed, "the sidecar waited for the headers for as long as the client liked"
    assert elapsed < 5.0  # 1 s of client timeout, and generous room for a busy machine
    assert upstream.received == []
    assert side.value("llmobs_requests_total") == 0  # no request ever began
    await back_to(baseline)


async def test_slowloris_body_gets_408_after_the_client_timeout(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim()
    side = await start_sidecar(sim.url, client_timeout=1.0, **QUIET)
    baseline = Usage.now()
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(side))
    writer.write(
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: 1000\r\n\r\n{{".encode()
    )
    answer = asyncio.ensure_future(read_response(reader))
    for _ in range(30):  # a byte every 0.3 s: dribbling does not reset the budget
        if answer.done():
            break
        with contextlib.suppress(ConnectionError):
            writer.write(b" ")
        await asyncio.sleep(0.3)
    response = await asyncio.wait_for(answer, 5.0)
    elapsed = loop.time() - started
    writer.close()
    assert response.status == 408
    assert json.loads(response.body)["error"]["type"] == "request_timeout"
    assert response.header("Connection") == "close"
    assert elapsed < 5.0
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="rejected", status_class="4xx") == 1
    assert sim.engine.counters.waiting == sim.engine.counters.running == 0  # never submitted
    await back_to(baseline)


@pytest.mark.parametrize(
    "body", [b"{broken", b"", b"[1, 2]", b"\xff\xfe\x00", b'{"messages": 5, "stream": true}']
)
async def test_invalid_json_bodies_are_relayed_and_the_engine_answers(
    start_sim: SimFactory, start_sidecar: SidecarFactory, body: bytes
) -> None:
    sim = await start_sim()
    side = await start_sidecar(sim.url, **QUIET)
    answers = []
    for url in (sim.url, side.url):
        headers = {"Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + CHAT, data=body, headers=headers) as r,
        ):
            answers.append((r.status, r.headers["Content-Type"], await r.read()))
    assert answers[0] == answers[1]  # exactly what the engine said
    assert answers[0][0] == 400
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_requests_total", outcome="ok", status_class="4xx") == 1
    assert side.value("llmobs_observer_errors_total") == 0


async def test_pipelined_and_keep_alive_requests_on_one_connection(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(output_tokens_min=5, output_tokens_max=5, decode_base=0.002)
    side = await start_sidecar(sim.url, **QUIET)
    async with aiohttp.ClientSession() as s, s.get(side.url + "/v1/models") as r:
        await r.read()  # the sidecar now holds a pooled connection to the engine: the baseline
    baseline = Usage.now()

    def post(body: dict[str, Any]) -> bytes:
        raw = json.dumps(body).encode()
        return (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(raw)}\r\n\r\n").encode() + raw  # fmt: skip

    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(side))
    # Keep-alive: one request, its whole answer, then the next on the same connection.
    writer.write(post(STREAM))
    response = await read_response(reader)
    assert response.status == 200
    assert response.body.endswith(b"data: [DONE]\n\n")
    # Pipelined: three requests in one write; three answers, in order.
    plain = {**STREAM, "stream": False}
    writer.write(post(plain) + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" + post(STREAM))
    answers = [await asyncio.wait_for(read_response(reader), 10) for _ in range(3)]
    writer.close()
    assert [a.status for a in answers] == [200, 200, 200]
    assert json.loads(answers[0].body)["object"] == "chat.completion"
    assert json.loads(answers[1].body)["object"] == "list"
    assert answers[2].body.endswith(b"data: [DONE]\n\n")
    await eventually(lambda: side.value("llmobs_requests_total") == 5)
    assert side.value("llmobs_requests_total", outcome="ok") == 5
    assert sim.engine.counters.completed == 3
    await back_to(baseline)


async def test_cancelling_300_streams_at_once_reaches_the_engine(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    count = 300
    sim = await start_sim(
        max_batch=64, prefill_base=0.001, prefill_per_token=0.0, decode_base=0.02,
        decode_per_seq=0.0, output_tokens_min=2000, output_tokens_max=2000,
    )  # fmt: skip
    side = await start_sidecar(sim.url, **QUIET)
    baseline = Usage.now()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    streams = [
        asyncio.ensure_future(stream_until_cancelled(session, side.url)) for _ in range(count)
    ]
    await eventually(lambda: sim.engine.counters.waiting + sim.engine.counters.running == count, 30)
    await eventually(lambda: side.value("llmobs_requests_active") == count, 30)
    assert side.value("llmobs_prefill_queue_depth") >= count - 64  # waiting for a first token
    for stream in streams:
        stream.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
    await session.close()

    await eventually(lambda: sim.engine.counters.cancelled == count, 30)  # every one reached it
    assert engine_idle(sim.engine)
    assert sim.engine.counters.completed == 0
    await eventually(lambda: side.value("llmobs_requests_total") == count, 30)
    assert side.value("llmobs_requests_total", outcome="client_disconnect") == count
    assert side.value("llmobs_requests_active") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0
    await back_to(baseline, within=15)
