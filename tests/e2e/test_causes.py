"""Why a stream stalled, against the truth: the simulated engine runs a mixed load in which
new requests' prefills block decoding, the whole engine pauses every so often, and a full KV
cache preempts requests (recomputed later), and keeps the truth of every pause (which requests
it held, why). The sidecar, scraping the engine's preemption counter, gives each stall a cause
on its span; at least 95 % must be the true one. A client that stops reading makes its own
stall, classified ``client``, while the engine's stream stays steady."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.export.telemetry import build_telemetry
from llmobs.sim.engine import SimPause
from tests.support.cli import cli
from tests.support.prom import Prometheus, Target, needs_prometheus, until
from tests.support.scripted import Script, ScriptedUpstream, chat_chunk, sse
from tests.support.servers import (
    AppFactory,
    SidecarFactory,
    SidecarHandle,
    SimFactory,
    eventually,
)

SCHEDULE: dict[str, Any] = {
    "max_batch": 4, "prefill_base": 0.08, "prefill_per_token": 0.0, "decode_base": 0.02,
    "decode_per_seq": 0.0, "output_tokens_min": 30, "output_tokens_max": 45,
    "stall_every": 23, "stall_ms": 150.0, "kv_capacity": 100,
}  # fmt: skip
REQUESTS = 24
SCRAPE_S = 0.05  # the engine collector's interval: how exactly a preemption is placed


async def stream(url: str, name: str, delay: float) -> None:
    """One streaming chat request named ``name`` (X-Request-Id), sent after ``delay``."""
    await asyncio.sleep(delay)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {"X-Request-Id": name}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status == 200
        async for _ in r.content:
            pass


def truth_of(pauses: list[SimPause], seq: int, start_s: float, end_s: float) -> str:
    """The cause of the engine's pause of ``seq`` that covers most of the gap; "none" when
    the engine held it back in none (a hiccup of the host: the sidecar shares the host's
    process with the engine, and sees the whole engine stop)."""
    best, most = "none", 0.0
    for pause in pauses:
        if seq in pause.seqs:
            overlap = min(end_s, pause.end) - max(start_s, pause.start)
            if overlap > most:
                best, most = pause.cause.value, overlap
    return best


async def test_each_stall_gets_its_true_cause(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**SCHEDULE)
    exporter = InMemorySpanExporter()
    side = await start_sidecar(
        sim.url, telemetry=build_telemetry(span_exporter=exporter),
        engine_scrape_interval=SCRAPE_S,
    )  # fmt: skip
    await eventually(lambda: side.sidecar.collectors.engine is not None
                     and side.sidecar.collectors.engine.up)  # fmt: skip
    rng = random.Random(36)
    arrivals = sorted(rng.uniform(0.0, 3.0) for _ in range(REQUESTS))
    await asyncio.gather(*(stream(side.url, f"r{i}", t) for i, t in enumerate(arrivals)))
    await eventually(lambda: side.value("llmobs_requests_total") == REQUESTS)
    side.sidecar.flush_traces()
    pauses = list(sim.engine.pauses)
    # the wall clock spans are on, less the monotonic one of the relay and the engine's loop
    offset = time.time_ns() - time.perf_counter_ns()
    seqs = {f"chatcmpl-{name}": seq for name, seq in sim.engine.seqs.items()}
    spans = {s.context.span_id: s for s in exporter.get_finished_spans()}
    judged: Counter[tuple[str, str]] = Counter()
    for span in spans.values():
        events = [e for e in span.events if e.name == "llmobs.stall"]
        if not events:
            continue
        parent = spans[span.parent.span_id] if span.parent else span
        seq = seqs[str((parent.attributes or {})["gen_ai.response.id"])]
        for event in events:
            attrs: dict[str, Any] = dict(event.attributes or {})
            end_s = (event.timestamp - offset) / 1e9
            start_s = end_s - attrs["llmobs.stall.gap"]
            judged[(truth_of(pauses, seq, start_s, end_s), attrs["llmobs.stall.cause"])] += 1
    # judged against the engine's own pauses: a host's hiccup (a loaded machine's) has no
    # true cause to be right about, so it is in the table and not in the score
    total = sum(n for (truth, _), n in judged.items() if truth != "none")
    right = sum(n for (truth, cause), n in judged.items() if truth == cause)
    table = json.dumps({f"{t} -> {c}": n for (t, c), n in sorted(judged.items())}, indent=1)
    truths = Counter(t for (t, _), n in judged.items() for _ in range(n))
    # the load made every kind of engine pause, and the sidecar saw them
    assert {"prefill", "engine_pause", "preemption"} <= set(truths), table
    assert sim.engine.counters.preemptions > 0
    assert right >= 0.95 * total, table
    # the counter by cause holds what the spans do
    for cause in ("prefill", "engine_pause", "preemption", "client", "unknown"):
        counted = sum(n for (_, c), n in judged.items() if c == cause)
        assert side.value("llmobs_stalls_total", cause=cause) == counted, cause


# large tokens: the buffers between the relay and the client (the kernel's send queue grows
# to 4 MiB on loopback) fill within a second
CHUNK_TEXT = "x" * 65536
STEADY_S = 0.01
CHUNKS = 200
STALL_MIN_GAP = 0.3  # the client's pause holds the stream for most of its length


async def test_a_client_that_stops_reading_makes_its_own_stall(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    """The engine streams a chunk every 10 ms; the client reads, stops for 2 s, reads the
    rest. Its buffers fill, the relay stops reading the engine, and the gap the sidecar sees
    is the client's: classified ``client``, on the counter and on the span."""
    steps = tuple((STEADY_S, event) for event in sse(*(chat_chunk(CHUNK_TEXT),) * CHUNKS))
    upstream = ScriptedUpstream({"default": Script((*steps, (0.0, b"data: [DONE]\n\n")))})
    url = await start_app(upstream.app())
    exporter = InMemorySpanExporter()
    # only a gap of the client's making is a stall here, not a loaded machine's late chunk
    side = await start_sidecar(
        url, telemetry=build_telemetry(span_exporter=exporter), stall_min_gap=STALL_MIN_GAP
    )
    host, port = side.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, as a slow phone
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nConnection: close\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
    received = 0
    while received < 20 * len(CHUNK_TEXT):  # a steady start: the client keeps up
        received += len(await reader.read(65536))
    await asyncio.sleep(2.0)  # the client stops reading
    while data := await reader.read(65536):
        received += len(data)
    writer.close()
    assert received > CHUNKS * len(CHUNK_TEXT)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    side.sidecar.flush_traces()
    assert side.value("llmobs_stalls_total", cause="client") >= 1
    assert side.value("llmobs_stalls_total") == side.value("llmobs_stalls_total", cause="client")
    events = [
        e for s in exporter.get_finished_spans() for e in s.events if e.name == "llmobs.stall"
    ]
    assert events and {(e.attributes or {})["llmobs.stall.cause"] for e in events} == {"client"}
    assert max(float((e.attributes or {})["llmobs.stall.gap"]) for e in events) > 0.5  # type: ignore[arg-type]


WHY_ENGINE: dict[str, Any] = {
    "max_batch": 1, "prefill_base": 0.02, "prefill_per_token": 0.0, "decode_base": 0.01,
    "decode_per_seq": 0.0, "output_tokens_min": 20, "output_tokens_max": 20, "stall_every": 8,
    "stall_ms": 80.0, "per_request_metrics": True,
}  # fmt: skip
WHY_SLO: dict[str, Any] = {"slo_ttft": 0.15, "slo_no_stalls": True}
WHY_REQUESTS = 6


async def why_traffic(side: SidecarHandle) -> None:
    """Six requests at once on a batch of one: all but the first wait in the engine's queue
    (about 0.3 s each), and the engine pauses every 8th step."""
    before = side.value("llmobs_requests_total")
    await asyncio.gather(*(stream(side.url, f"w{i}", 0.0) for i in range(WHY_REQUESTS)))
    await eventually(lambda: side.value("llmobs_requests_total") == before + WHY_REQUESTS)


async def test_llmobs_why_reads_the_causes_off_a_sidecar(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(**WHY_ENGINE)
    side = await start_sidecar(sim.url, **WHY_SLO)
    code, text = await asyncio.to_thread(cli, "why", "--metrics-url", side.metrics_url + "/metrics")
    assert code == 2 and text == ""  # nothing slow yet: nothing to say
    await why_traffic(side)
    code, text = await asyncio.to_thread(
        cli, "why", "--metrics-url", side.metrics_url + "/metrics", "--json"
    )
    assert code == 0, text
    every = json.loads(text)["label_sets"][0]
    assert (every["operation"], every["model"]) == ("all", "all")
    # the queued requests missed their TTFT in the engine's queue, as the engine reported
    queued = side.value("llmobs_slo_misses_total", objective="ttft", cause="queue")
    assert queued >= WHY_REQUESTS - 2
    assert every["ttft_misses"]["queue"] == queued
    assert sum(every["ttft_misses"].values()) == side.value(
        "llmobs_slo_misses_total", objective="ttft")  # fmt: skip
    # every stall is the engine's pause (one stream at a time), as counted
    assert every["stalls"] == {"engine_pause": side.value("llmobs_stalls_total")}
    assert every["stalls"]["engine_pause"] >= WHY_REQUESTS
    code, text = await asyncio.to_thread(cli, "why", "--metrics-url", side.metrics_url + "/metrics")
    assert code == 0
    lines = text.splitlines()
    assert lines[1] == "all requests:"
    assert lines[2].startswith(f"  TTFT misses ({queued + 0:.0f}): ") and "% queue" in lines[2]
    assert "stalls" in text and "100% engine pauses" in text


@needs_prometheus
async def test_llmobs_why_reads_the_causes_off_prometheus(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sim = await start_sim(**WHY_ENGINE)
    side = await start_sidecar(sim.url, **WHY_SLO)
    targets = [Target("llmobs", side.metrics_url, {"namespace": "ci", "pod": "llm-0"})]
    async with Prometheus(tmp_path, targets) as prom:
        await stream(side.url, "first", 0.0)  # the label set's series, scraped at 0 first
        await until(prom, "sum(llmobs_stalls_total)", side.value("llmobs_stalls_total"))
        await why_traffic(side)
        await until(prom, "sum(llmobs_stalls_total)", side.value("llmobs_stalls_total"))
        code, text = await asyncio.to_thread(
            cli, "why", "--prometheus", prom.url, "--range", "5m", "--json"
        )
    assert code == 0, text
    every = json.loads(text)["label_sets"][0]
    assert max(every["ttft_misses"], key=every["ttft_misses"].get) == "queue"
    assert set(every["stalls"]) == {"engine_pause"}
