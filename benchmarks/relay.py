"""Relay benchmark: what the sidecar costs per chunk and per request.

Not a test: run it by hand (``python benchmarks/relay.py``) and record the figures in
docs/benchmarks.md with the machine they came from.

Two measurements:
1. in-process micro-benchmark of the observation path alone: ``Observer.chunk`` per SSE event
   (vLLM-shaped chunks), ``Observer.finish`` per request (statistics + metric records) and the
   start (``observer_factory``, request body, forwarded, response headers), for ``--tokens``
   chunks and for short requests (``--short-tokens``, where fixed costs per request dominate);
2. end to end over loopback, each party in its own process: a fast upstream that streams
   vLLM-shaped chunks with no delay, then the same load direct, through ``llmobs serve`` with
   instrumentation, and through it with ``--instrument false``. Reports relayed events/s and
   the sidecar's CPU time per event (from /proc/<pid>/stat), i.e. the relay's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from llmobs.app import observer_factory, tracing_for  # noqa: E402
from llmobs.collectors import Collectors  # noqa: E402
from llmobs.config.settings import Settings  # noqa: E402
from llmobs.export.metrics.exposition import Format, render  # noqa: E402
from llmobs.export.telemetry import build_telemetry  # noqa: E402
from llmobs.export.tracing import RequestMeta  # noqa: E402
from llmobs.observe.dialects import OPENAI_CHAT, OPENAI_COMPLETIONS, OTHER_ROUTE  # noqa: E402
from llmobs.observe.observer import Observer, ObserveSettings  # noqa: E402
from llmobs.observe.timing import Outcome  # noqa: E402
from tests.support.exposition import rendered  # noqa: E402
from tests.support.recording import recording  # noqa: E402

CHUNK = (
    b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk",'
    b'"created":1700000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,'
    b'"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
)
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":%d}}\n\n'


def micro(tokens: int, requests: int, tracing: bool = False) -> dict[str, float]:
    """Observation as ``llmobs serve`` wires it (``app.observer_factory``, the collectors'
    MBU/MFU consumer after the sink, a model shape so that the hook does its work), per request:
    start (factory, request body, forwarded, response headers), ``tokens`` chunks, finish.
    With ``tracing`` the spans go to memory; their writing thread runs meanwhile, as in the
    sidecar, and is drained after each run (not timed)."""
    telemetry = build_telemetry(span_exporter=InMemorySpanExporter() if tracing else None)
    settings = Settings(model_params=8e9, gpu_sample_interval=0, engine_scrape_interval=0)
    collectors = Collectors(settings, telemetry.meter)
    _, recorder = recording(telemetry.registry, settings.max_models, consumers=[collectors])
    tracer = tracing_for(settings, telemetry)
    new = observer_factory(settings, recorder, tracer)
    body = b'{"model":"m","stream":true,"messages":[]}'
    meta = RequestMeta("POST", "/v1/chat/completions", {}, 0)
    start_ns = chunk_ns = finish_ns = 0
    for r in range(requests):
        a = time.perf_counter_ns()
        obs = new(OPENAI_CHAT, 0, meta)
        obs.request_body(body)
        obs.inject({})
        obs.forwarded(0)
        obs.response(200, "text/event-stream")
        t = 100_000_000
        start = time.perf_counter_ns()
        for _ in range(tokens):
            t += 20_000_000
            obs.chunk(t, CHUNK)
        obs.chunk(t, USAGE % tokens + b"data: [DONE]\n\n")
        mid = time.perf_counter_ns()
        obs.finish(t + 1, Outcome.OK)
        end = time.perf_counter_ns()
        if r:  # the first request warms up
            start_ns += start - a
            chunk_ns += mid - start
            finish_ns += end - mid
    if tracer is not None:
        tracer.close()
    telemetry.shutdown()
    n = requests - 1
    chunk_us = chunk_ns / n / tokens / 1000
    finish_us = finish_ns / n / 1000
    start_us = start_ns / n / 1000
    return {"chunk_us": chunk_us, "finish_us": finish_us, "start_us": start_us,
            "request_us": tokens * chunk_us + finish_us,
            "request_with_start_us": start_us + tokens * chunk_us + finish_us}  # fmt: skip


def scrape_lag(models: int, operations: int, interval: float) -> dict[str, float]:
    """Event-loop lag while /metrics is rendered back to back the way the admin app's handler
    renders it (``metrics.exposition.render``: the request series on the loop in
    parts, the rest in the render thread). ``render_ms``: one render once every series' text
    is cached."""
    telemetry = build_telemetry()
    _, recorder = recording(telemetry.registry, 32)
    for m in range(models):
        for op in (OPENAI_CHAT, OPENAI_COMPLETIONS, OTHER_ROUTE)[:operations]:
            for status in (200, 404, 500):
                obs = Observer(recorder, ObserveSettings(), op, 0)
                obs.request_body(b'{"model":"model-%d","stream":true}' % m)
                obs.response(status, "text/event-stream")
                for i in range(5):
                    obs.chunk(i * 20_000_000, CHUNK)
                obs.finish(10**9, Outcome.OK)
    rendered(telemetry.registry)  # the first render builds each series' label text
    start = time.perf_counter()
    size = len(rendered(telemetry.registry))
    render_ms = (time.perf_counter() - start) * 1000

    async def measure() -> list[float]:
        previous = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        pool = ThreadPoolExecutor(1)
        done = False

        async def scraper() -> None:
            while not done:
                await render(Format.TEXT, telemetry.registry, pool)

        task = asyncio.ensure_future(scraper())
        lags = []
        for _ in range(2000):
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((time.perf_counter() - t - 0.001) * 1000)
        done = True
        await task
        sys.setswitchinterval(previous)
        return sorted(lags)

    lags = asyncio.run(measure())
    return {"render_ms": render_ms, "bytes": size, "lag_p50_ms": lags[1000],
            "lag_p99_ms": lags[1980], "lag_max_ms": lags[-1]}  # fmt: skip


def upstream_main(port: int, tokens: int) -> None:
    """A fast upstream: every request streams ``tokens`` chunks as fast as it can."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(tokens):
            await resp.write(CHUNK)
        await resp.write(USAGE % tokens + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_port(port: int) -> None:
    for _ in range(300):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


async def drive(url: str, concurrency: int, requests: int) -> tuple[int, float]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    events = 0
    per_client = requests // concurrency

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal events
        for _ in range(per_client):
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                data = await r.read()
                events += data.count(b"data: ")

    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        await asyncio.gather(*(client(s) for _ in range(concurrency)))
    return events, time.perf_counter() - start


async def end_to_end(tokens: int, concurrency: int, requests: int, rounds: int) -> list[dict]:
    up_port = free_port()
    upstream = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--upstream", str(up_port), "--tokens", str(tokens)
    )
    results = []
    try:
        await wait_port(up_port)
        targets: list[tuple[str, list[str] | None]] = [
            ("direct", None),
            ("llmobs (instrumented)", ["--instrument", "true"]),
            ("llmobs (--instrument false)", ["--instrument", "false"]),
        ]
        for rnd in range(rounds):
            for name, flags in targets:
                proc = None
                url = f"http://127.0.0.1:{up_port}"
                if flags is not None:
                    port, mport = free_port(), free_port()
                    proc = await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "llmobs", "serve", "--upstream", url,
                        "--host", "127.0.0.1", "--port", str(port), "--metrics-host",
                        "127.0.0.1", "--metrics-port", str(mport), "--log-level", "warning",
                        *flags, cwd=ROOT,
                    )  # fmt: skip
                    await wait_port(port)
                    url = f"http://127.0.0.1:{port}"
                    await drive(url, concurrency, concurrency)  # warm up
                cpu0 = cpu_seconds(proc.pid) if proc else 0.0
                events, wall = await drive(url, concurrency, requests)
                cpu = cpu_seconds(proc.pid) - cpu0 if proc else 0.0
                if proc:
                    proc.terminate()
                    await proc.wait()
                results.append({
                    "round": rnd, "target": name, "events": events, "wall_s": wall,
                    "events_per_s": events / wall,
                    "sidecar_cpu_us_per_event": cpu / events * 1e6 if proc else None,
                })  # fmt: skip
    finally:
        upstream.terminate()
        await upstream.wait()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=256, help="chunks per response [256]")
    parser.add_argument(
        "--short-tokens", type=int, default=8, help="chunks per response, short requests [8]"
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-only", action="store_true", help="skip scrapes, end to end")
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end part")
    args = parser.parse_args()
    if args.upstream:
        upstream_main(args.upstream, args.tokens)
        return
    print("micro-benchmark (observation only, in process; median of 7 runs):")
    results = {}
    for tokens, short in ((args.tokens, False), (args.short_tokens, True)):
        for tracing in (False, True):
            runs = [micro(tokens, 100, tracing) for _ in range(7)]
            m = {k: sorted(r[k] for r in runs)[3] for k in runs[0]}
            results[("short_" if short else "") + ("tracing" if tracing else "micro")] = m
            label = "on " if tracing else "off"
            print(f"  {tokens:4d} tokens, tracing {label}: Observer.chunk {m['chunk_us']:.2f} us "
                  f"per SSE event, Observer.finish {m['finish_us']:.1f} us, per request "
                  f"{tokens} x chunk + finish = {m['request_us']:.0f} us (+ start "
                  f"{m['start_us']:.1f} us = {m['request_with_start_us']:.0f} us)")  # fmt: skip
    if args.micro_only:
        print(json.dumps(results))
        return
    print("scrape: event-loop lag while /metrics renders back to back in its thread:")
    scrapes = []
    for models, ops in ((1, 2), (32, 3)):
        for interval in (0.005, 0.001):
            r = scrape_lag(models, ops, interval)
            scrapes.append({"models": models, "operations": ops, "switch_ms": interval * 1000, **r})
            print(f"  {models:2d} models x {ops} ops ({r['bytes'] / 1024:6.0f} KiB, render "
                  f"{r['render_ms']:5.1f} ms), switch interval {interval * 1000:.0f} ms: "
                  f"lag p50 {r['lag_p50_ms']:.2f} p99 {r['lag_p99_ms']:.2f} "
                  f"max {r['lag_max_ms']:.2f} ms")  # fmt: skip
    if args.no_e2e:
        print(json.dumps({**results, "scrape": scrapes}))
        return
    print(f"end to end: {args.concurrency} streams, {args.requests} requests x {args.tokens} "
          f"chunks, {args.rounds} rounds")  # fmt: skip
    rows = asyncio.run(end_to_end(args.tokens, args.concurrency, args.requests, args.rounds))
    for row in rows:
        cpu = row["sidecar_cpu_us_per_event"]
        print(f"  round {row['round']} {row['target']:30s} {row['events_per_s']:9.0f} events/s"
              + (f"  sidecar CPU {cpu:6.1f} us/event" if cpu is not None else ""))  # fmt: skip
    print(json.dumps({**results, "scrape": scrapes, "end_to_end": rows}))


if __name__ == "__main__":
    main()
