"""WebSockets through the sidecar, end to end, with the real ``websockets`` client and the
sim's ``/v1/realtime`` (vLLM's protocol): the handshake intact, every byte both ways, the
session measured (its turns' first deltas and gaps against what the client saw, its
messages, its outcome) on metrics and spans; the limits (a message over the limit, an idle
session) and each leg closed when the other closes."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import trustme
import websockets
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from websockets.exceptions import ConnectionClosed

from llmobs.export.telemetry import build_telemetry
from tests.support.certs import issue
from tests.support.realtime import one_session
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually

MODEL = "sim-llama-3-8b"
SIM: dict[str, Any] = {"prefill_base": 0.02, "prefill_per_token": 0.0, "decode_base": 0.01}
CHUNK = base64.b64encode(bytes(3200)).decode()  # 100 ms of 16 kHz PCM16


def _ws(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/v1/realtime"


async def _turn(ws: Any, chunks: int) -> tuple[float, list[float], dict[str, Any]]:
    """One transcription as vLLM's client does it; the client's own view: seconds from the
    commit to the first delta, the gaps between deltas, the done event."""
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    committed = time.perf_counter()
    for _ in range(chunks):
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": CHUNK}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
    stamps: list[float] = []
    text = ""
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "transcription.delta":
            stamps.append(time.perf_counter())
            text += event["delta"]
        elif event["type"] == "transcription.done":
            assert event["text"] == text  # every delta came through, unchanged
            gaps = [b - a for a, b in itertools.pairwise(stamps)]
            return stamps[0] - committed, gaps, event
        else:
            raise AssertionError(event)


async def _session(url: str, turns: int, chunks: int) -> list[tuple[float, list[float], Any]]:
    async with websockets.connect(_ws(url)) as ws:
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "model": MODEL}))
        return [await _turn(ws, chunks) for _ in range(turns)]


def _series(side: SidecarHandle, name: str, **labels: str) -> float:
    return side.value(name, **labels)


async def test_a_realtime_session_is_relayed_and_measured(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    spans = InMemorySpanExporter()
    sim = await start_sim(**SIM)
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=spans))
    seen = await _session(side.url, turns=2, chunks=3)
    for first, gaps, done in seen:
        assert done["usage"]["completion_tokens"] == 6  # 3 chunks, 2 tokens each
        assert len(gaps) == 5
        assert first > 0
    await eventually(lambda: _series(side, "llmobs_websocket_sessions_total") == 1)
    labels = {"api": "realtime", "gen_ai_request_model": MODEL}
    assert _series(side, "llmobs_websocket_sessions_total", outcome="ok", **labels) == 1
    assert _series(side, "llmobs_realtime_turns_total", outcome="done") == 2
    assert _series(side, "llmobs_realtime_time_to_first_delta_seconds_count") == 2
    assert _series(side, "llmobs_realtime_delta_gap_seconds_count") == 10
    # each turn's first delta as the sidecar saw it: within the client's own, which also
    # holds the client's and the sidecar's loop turns, and no less than the engine's prefill
    total = _series(side, "llmobs_realtime_time_to_first_delta_seconds_sum")
    client_total = sum(first for first, _, _ in seen)
    assert 0.02 * 2 <= total <= client_total + 0.05
    # messages: session.update, 2 x (commit, 3 appends, final commit), the close: 12; from
    # the engine: session.created, 2 x (6 deltas, done), the close: 16
    assert _series(side, "llmobs_websocket_messages_total", source="client") == 12
    assert _series(side, "llmobs_websocket_messages_total", source="engine") == 16
    assert _series(side, "llmobs_websocket_sessions_active") == 0
    side.sidecar.flush_traces()
    (span,) = [s for s in spans.get_finished_spans() if s.name == "websocket realtime"]
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["llmobs.outcome"] == "ok"
    assert attrs["llmobs.websocket.close_code"] == 1000
    assert attrs["llmobs.websocket.closed_by"] == "client"
    assert [e.name for e in span.events] == ["llmobs.realtime.turn"] * 2
    assert all(e.attributes and e.attributes["llmobs.realtime.deltas"] == 6 for e in span.events)


async def test_the_handshake_reaches_the_engine_intact(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SIM)
    side = await start_sidecar(sim.url)
    async with websockets.connect(_ws(side.url), subprotocols=["realtime"]) as ws:  # type: ignore[list-item]
        await ws.recv()
        assert ws.response is not None
        assert ws.response.status_code == 101
        assert ws.response.headers["Upgrade"].lower() == "websocket"
        # permessage-deflate offered by the client, accepted by aiohttp: negotiated through
        assert "permessage-deflate" in ws.response.headers.get("Sec-WebSocket-Extensions", "")
    headers = sim.engine.counters.last_headers
    assert headers["upgrade"] == "websocket"
    assert "upgrade" in headers["connection"].lower()
    assert "sec-websocket-key" in headers
    assert headers["sec-websocket-protocol"] == "realtime"


async def test_a_refused_upgrade_is_an_ordinary_response(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    side = await start_sidecar((await start_sim(**SIM)).url)
    with pytest.raises(websockets.InvalidStatus) as caught:
        async with websockets.connect(side.url.replace("http", "ws") + "/v1/not-a-route"):
            pass
    assert caught.value.response.status_code == 404
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total", status_class="4xx") == 1
    assert side.value("llmobs_websocket_sessions_total") == 0


async def test_a_message_over_the_limit_ends_the_session_with_1009(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SIM)
    side = await start_sidecar(sim.url, websocket_max_message_bytes=4096)
    async with websockets.connect(_ws(side.url), compression=None) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "model": MODEL}))
        await ws.send("x" * 5000)
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    await eventually(lambda: side.value("llmobs_websocket_sessions_total") == 1)
    assert side.value("llmobs_websocket_sessions_total", outcome="too_large") == 1


async def test_an_idle_session_is_closed_with_1001(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SIM)
    side = await start_sidecar(sim.url, websocket_idle_timeout=0.5)
    # no pings from the client: only the idle limit can end this session
    async with websockets.connect(_ws(side.url), ping_interval=None) as ws:
        await ws.recv()
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    await eventually(lambda: side.value("llmobs_websocket_sessions_total") == 1)
    assert side.value("llmobs_websocket_sessions_total", outcome="idle_timeout") == 1


async def test_a_client_gone_without_a_close_frame_closes_the_engines_leg(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SIM)
    side = await start_sidecar(sim.url)
    ws = await websockets.connect(_ws(side.url))
    await ws.recv()
    await ws.send(json.dumps({"type": "session.update", "model": MODEL}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": CHUNK}))
    ws.transport.abort()
    await eventually(lambda: side.value("llmobs_websocket_sessions_total") == 1)
    assert side.value("llmobs_websocket_sessions_total", outcome="client_disconnect") == 1
    # the engine saw its leg close: its sequences are cancelled or done, none left running
    await eventually(lambda: sim.engine.counters.running == 0)


async def test_over_tls_and_with_permessage_deflate(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    served = issue(trustme.CA(), tmp_path)
    sim = await start_sim(**SIM)
    side = await start_sidecar(
        sim.url, tls_cert_file=str(served.cert), tls_key_file=str(served.key)
    )
    await one_session(side.url, MODEL, served.trusting())
    await eventually(lambda: side.value("llmobs_websocket_sessions_total") == 1)
    # one turn done, one cut short by the client's close; both timed
    assert side.value("llmobs_realtime_turns_total", outcome="done") == 1
    assert side.value("llmobs_realtime_turns_total", outcome="cut") == 1
    assert side.value("llmobs_realtime_time_to_first_delta_seconds_count") == 2


async def test_with_websockets_off_the_upgrade_never_reaches_the_engine(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SIM)
    side = await start_sidecar(sim.url, websocket=False)
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(_ws(side.url)):
            pass
    assert "upgrade" not in sim.engine.counters.last_headers
    side.sidecar.flush_records()
    assert side.value("llmobs_requests_total") == 1
    assert side.value("llmobs_websocket_sessions_total") == 0
