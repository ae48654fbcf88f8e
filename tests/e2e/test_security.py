"""Security: no request smuggling, no secrets anywhere, bounded label cardinality."""

from __future__ import annotations

import asyncio
import logging
import re

import aiohttp
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.export.telemetry import build_telemetry
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.recording import record_request, recording
from tests.support.scripted import ScriptedUpstream
from tests.support.servers import AppFactory, SidecarFactory, SimFactory, eventually

SECRET_KEY = "sk-proj-TOPSECRET-0123456789"
SECRET_PROMPT = "my bank PIN is 4921-SECRET-PROMPT"


async def raw_request(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",  # CL.TE
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",  # TE.CL
        b"Content-Length: 5\r\nContent-Length: 6\r\n",  # conflicting lengths
        b"Transfer-Encoding: chunked, identity\r\n",  # not a final chunked coding
    ],
)
async def test_request_smuggling_is_rejected_not_forwarded(
    start_app: AppFactory, start_sidecar: SidecarFactory, head: bytes
) -> None:
    upstream = ScriptedUpstream()
    side = await start_sidecar(await start_app(upstream.app()))
    port = int(side.url.rsplit(":", 1)[1])
    smuggled = b"0\r\n\r\nGET /admin HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = await raw_request(
        port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + smuggled
    )
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    # refused before it was parsed, it still ends in an outcome: attempts show on /metrics
    rejected = {"gen_ai_operation_name": "other", "outcome": "rejected", "status_class": "4xx"}
    await eventually(lambda: side.value("llmobs_requests_total", **rejected) == 1)
    assert upstream.received == []  # neither request reached the engine
    assert side.value("llmobs_requests_total") == 1


async def test_a_pipelined_request_refused_unparsed_is_timed_from_its_own_turn(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """A malformed request pipelined behind a slow one waits for it, in the sidecar's
    buffer; its duration starts when its turn does, not with the first request's head."""
    sim = await start_sim(
        decode_base=0.02, prefill_base=0.001, error_rate=0.0,
        output_tokens_min=20, output_tokens_max=20,
    )  # fmt: skip
    side = await start_sidecar(sim.url)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}'
    port = int(side.url.rsplit(":", 1)[1])
    first = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(first + b"GET / HTTP/1.1\r\nHost : x\r\n\r\n")  # whitespace before a colon
    answers = await asyncio.wait_for(reader.read(), 10)  # the stream, then the 400 and a close
    writer.close()
    assert answers.startswith(b"HTTP/1.1 200 OK")
    assert b" 400 Bad Request" in answers
    await eventually(lambda: side.value("llmobs_requests_total") == 2)
    duration = "gen_ai_server_request_duration_seconds_sum"
    assert side.value(duration, gen_ai_operation_name="chat") > 0.3  # 20 tokens, 20 ms apart
    assert side.value(duration, gen_ai_operation_name="other") < 0.1


async def test_no_secret_in_metrics_spans_or_logs(
    start_sim: SimFactory, start_sidecar: SidecarFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    exporter = InMemorySpanExporter()
    sim = await start_sim(decode_base=0.002, prefill_base=0.001, error_rate=0.0)
    side = await start_sidecar(sim.url, build_telemetry(span_exporter=exporter))
    headers = {"Authorization": f"Bearer {SECRET_KEY}", "X-Api-Key": SECRET_KEY}
    body = {"model": "m", "messages": [{"role": "user", "content": SECRET_PROMPT}], "stream": True}
    async with aiohttp.ClientSession() as s:
        url = side.url + f"/v1/chat/completions?api_key={SECRET_KEY}"
        async with s.post(url, json=body, headers=headers) as r:
            assert r.status == 200
            await r.read()
        async with s.post(side.url + "/v1/completions", data=b"{broken", headers=headers) as r:
            await r.read()  # the engine answers 400: relayed, observed
    # nothing listens: a 502, and a warning naming the engine (without its URL's password),
    # which the client's answer does not
    down = await start_sidecar("http://llmobs:TOPSECRET@127.0.0.1:9")
    async with aiohttp.ClientSession() as s:
        url = down.url + f"/v1/chat/completions?api_key={SECRET_KEY}"
        async with s.post(url, json=body, headers=headers) as r:
            assert r.status == 502
            answer = await r.text()
            assert SECRET_KEY not in answer and "127.0.0.1:9" not in answer
    await eventually(lambda: side.value("llmobs_requests_total") == 2)
    side.sidecar.flush_traces()
    exposition = ""
    async with aiohttp.ClientSession() as s:
        for target in (side, down):
            async with s.get(target.metrics_url + "/metrics") as r:
                exposition += await r.text()
    spans = repr([(x.name, x.attributes, [e.attributes for e in x.events])
                  for x in exporter.get_finished_spans()])  # fmt: skip
    logs = "\n".join(r.getMessage() + repr(r.args) for r in caplog.records)
    assert exporter.get_finished_spans()  # there were spans to search
    assert "upstream unavailable" in logs  # and log lines
    assert "(upstream_error; upstream http://127.0.0.1:9)" in logs
    for text in (exposition, spans, logs):
        assert SECRET_KEY not in text
        assert "TOPSECRET" not in text
        assert "SECRET-PROMPT" not in text


def _stats(model: str) -> RequestStats:
    return RequestStats(
        operation="chat", model=model, outcome=Outcome.OK, status=200, stream=True,
        duration_s=0.1, ttft_s=0.05, tpot_s=0.01, input_tokens=3, output_tokens=5,
        token_source=TokenSource.USAGE, chunks=5, itl_count=4, itl_sum=0.04, itl_sumsq=0.0004,
        itl_max=0.01, stalls=0, smoothness=1.0,
    )  # fmt: skip


def _series(requests: int) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    telemetry = build_telemetry()
    _, recorder = recording(telemetry.registry, max_models=16)
    for i in range(requests):
        record_request(recorder, _stats(f"attacker-model-{i}"))
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for fam in telemetry.registry.collect()
        for s in fam.samples
    }


def test_100k_distinct_model_names_cannot_grow_the_series() -> None:
    at_cap = _series(17)  # 16 models, and the 17th already reported as "other"
    flood = _series(100_000)
    models = {dict(labels).get("gen_ai_request_model") for _, labels in flood} - {None}
    assert len(models) == 18  # and unknown's series, there from the start
    assert {"other", "unknown"} <= models
    assert len(flood) == len(at_cap)  # 99,983 more names: not one more series


async def test_distinct_models_and_paths_over_http_stay_bounded(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    upstream = ScriptedUpstream()
    side = await start_sidecar(await start_app(upstream.app()), max_models=8)
    async with aiohttp.ClientSession() as s:

        async def one(i: int) -> None:
            path = f"/random/path/{i}" if i % 2 else "/v1/chat/completions"
            async with s.post(side.url + path, json={"model": f"m-{i}"}) as r:
                await r.read()

        for start in range(0, 600, 50):
            await asyncio.gather(*(one(i) for i in range(start, start + 50)))
    await eventually(lambda: side.value("llmobs_requests_total") == 600)
    async with aiohttp.ClientSession() as s, s.get(side.metrics_url + "/metrics") as r:
        text = await r.text()
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    models = set(re.findall(r'gen_ai_request_model="([^"]*)"', text))
    assert len(models) <= 10  # 8, other and unknown
    assert not any("/random/path" in line for line in series)  # paths are never labels
    assert len(series) < 1500
