"""Graceful shutdown (SIGTERM) and the admin port's protections."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.config.settings import Settings
from llmobs.export.telemetry import build_telemetry
from tests.support.servers import SidecarFactory, SimFactory, eventually

SCHEDULE: dict[str, Any] = {
    "max_batch": 4, "prefill_base": 0.05, "prefill_per_token": 0.0, "decode_base": 0.02,
    "decode_per_seq": 0.0,
}  # fmt: skip
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def outcomes(exporter: InMemorySpanExporter) -> list[str]:
    """The outcome of every request span the sidecar exported."""
    spans = exporter.get_finished_spans()
    return [str((s.attributes or {})["llmobs.outcome"]) for s in spans if s.name.startswith("chat")]


async def read_all(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=BODY) as r:
        return r.status, await r.read()  # raises ClientPayloadError if the end is not clean


async def test_in_flight_streams_finish_within_the_grace_and_new_ones_are_refused(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE, output_tokens_min=30, output_tokens_max=30)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=exporter), shutdown_grace=5.0)
    stream = asyncio.ensure_future(read_all(side.url))
    await eventually(lambda: side.value("llmobs_requests_active") == 1)
    stopping = asyncio.ensure_future(side.sidecar.stop())
    await eventually(lambda: side.sidecar.lifecycle.draining)
    async with aiohttp.ClientSession() as s, s.get(side.metrics_url + "/readyz") as r:
        assert r.status == 503  # out of the Service's endpoints while draining
    with pytest.raises(aiohttp.ClientConnectionError):
        await read_all(side.url)  # no longer accepting
    status, body = await stream
    assert status == 200
    assert body.endswith(b"data: [DONE]\n\n")  # finished, not cut
    await stopping
    # traces were written and flushed on the way out (the registry is closed by then)
    assert outcomes(exporter) == ["ok"]


async def test_streams_still_running_after_the_grace_end_cleanly_and_are_counted(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE, output_tokens_min=300, output_tokens_max=300)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=exporter), shutdown_grace=0.3)
    streams = [asyncio.ensure_future(read_all(side.url)) for _ in range(3)]
    await eventually(lambda: sim.engine.counters.running == 3)  # all three decoding
    loop = asyncio.get_running_loop()
    started = loop.time()
    await side.sidecar.stop()
    # the grace (and a loaded machine's margin), not the 6 s the streams would need
    assert loop.time() - started < 4.0
    for status, body in await asyncio.gather(*streams):  # no ClientPayloadError: a clean end
        assert status == 200
        assert b"data: {" in body
        assert not body.endswith(b"data: [DONE]\n\n")
    assert outcomes(exporter) == ["shutdown"] * 3
    await eventually(lambda: sim.engine.counters.cancelled == 3)  # the engine stopped generating


async def test_requests_still_waiting_for_a_response_at_the_grace_get_a_503(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """A request whose response head has not come by the end of the grace (not streamed,
    or queued in the engine) is answered 503 then, not cut without an answer after the
    grace and 5 s more; it is a ``shutdown``, and the engine stops working on it."""
    sim = await start_sim(**SCHEDULE, output_tokens_min=300, output_tokens_max=300)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=exporter), shutdown_grace=0.3)

    async def whole(url: str) -> tuple[int, bytes]:
        body, path = {**BODY, "stream": False}, url + "/v1/chat/completions"
        async with aiohttp.ClientSession() as s, s.post(path, json=body) as r:
            return r.status, await r.read()

    waiting = asyncio.ensure_future(whole(side.url))
    await eventually(lambda: sim.engine.counters.running == 1)  # decoding, its answer not begun
    loop = asyncio.get_running_loop()
    started = loop.time()
    await side.sidecar.stop()
    assert loop.time() - started < 4.0  # the grace and a margin, not the grace and 5 s
    status, body = await waiting
    assert status == 503
    assert b"shutting down" in body
    assert outcomes(exporter) == ["shutdown"]
    await eventually(lambda: sim.engine.counters.cancelled == 1)


async def test_a_request_that_reaches_the_relay_after_the_grace_gets_a_503(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """One still sending its body when the grace ends goes upstream no more: the engine
    would start work nobody waits for. It is answered 503, as those waiting for a head."""
    sim = await start_sim(**SCHEDULE)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=exporter), shutdown_grace=0.2)
    body = json.dumps(BODY).encode()
    port = int(side.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:10])
    )
    await writer.drain()
    await asyncio.sleep(0.2)  # its head is in: the sidecar is reading its body
    stopping = asyncio.ensure_future(side.sidecar.stop())
    await asyncio.sleep(0.5)  # past the grace: the relay has ended what it had
    writer.write(body[10:])
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await stopping
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:40]
    assert outcomes(exporter) == ["shutdown"]
    assert sim.engine.counters.requests_received == 0  # never sent


async def test_metrics_bearer_token(start_sim: SimFactory, start_sidecar: SidecarFactory) -> None:
    sim = await start_sim(**SCHEDULE)
    side = await start_sidecar(sim.url, metrics_token="s3cret-token")
    async with aiohttp.ClientSession() as s:
        async with s.get(side.metrics_url + "/metrics") as r:
            assert r.status == 401
            assert "s3cret" not in await r.text()
        wrong = {"Authorization": "Bearer nope"}
        async with s.get(side.metrics_url + "/metrics", headers=wrong) as r:
            assert r.status == 401
        right = {"Authorization": "Bearer s3cret-token"}
        async with s.get(side.metrics_url + "/metrics", headers=right) as r:
            assert r.status == 200
            assert "llmobs_requests_active" in await r.text()
        async with s.get(side.metrics_url + "/healthz") as r:
            assert r.status == 200  # probes stay open
    assert "s3cret" not in repr(side.sidecar.settings)
    assert "s3cret" not in repr(Settings(metrics_token="s3cret-token"))
