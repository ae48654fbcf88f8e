"""What a gRPC token stream costs the sidecar per message, against an HTTP/1.1 SSE stream's
per chunk, at a given number of concurrent streams.

Not a test: run it by hand (``python benchmarks/grpc_relay.py --streams 16,128``) and record
the figures in docs/benchmarks.md with the machine they came from. Each party is a process:
the simulated engine (``llmobs sim --grpc-port 0``, no prefill or decode delay, one token per
message or chunk), two ``llmobs serve`` in front of it (one to its HTTP port, one to its gRPC
port: h2c on both legs), and the clients in this process (httpx over HTTP/1.1, a connection per
stream, reading OpenAI chat chunks; grpcio's aio client on one channel, streaming vLLM's
``Generate``). The sidecar's CPU time (user + system, from /proc/<pid>/stat) over the run,
divided by the token messages the clients read, is the figure, as in transports.py.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from grpc import aio  # type: ignore[import-untyped, unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from transports import _client, _drain, _stream, cpu_seconds  # noqa: E402

from tests.support.grpc_apis import LOCAL, VLLM  # noqa: E402
from tests.support.ports import SERVE, SIM, listening  # noqa: E402

GRPC_LINE = r"llmobs sim: gRPC on [^ ]+:(\d+)"
Figure = dict[str, object]


async def _generate(channel: Any, tokens: int) -> int:
    """One streamed Generate: the token messages read."""
    call = VLLM.stub(channel).Generate(VLLM.request("b", tokens, True))
    messages = 0
    while (message := await call.read()) is not aio.EOF:
        messages += message.HasField("chunk")
    return messages


async def measure_grpc(url: str, cpu_now: Any, streams: int, rounds: int, tokens: int) -> Figure:
    async with aio.insecure_channel(url, options=LOCAL) as channel:
        await asyncio.gather(*(_generate(channel, 4) for _ in range(streams)))  # warm up
        before, began = cpu_now(), time.perf_counter()
        messages = 0
        for _ in range(rounds):
            done = await asyncio.gather(*(_generate(channel, tokens) for _ in range(streams)))
            messages += sum(done)
        cpu, wall = cpu_now() - before, time.perf_counter() - began
    return _figure("grpc (h2c, one channel)", streams, messages, cpu, wall)


async def measure_sse(url: str, cpu_now: Any, streams: int, rounds: int, tokens: int) -> Figure:
    async with _client("http1", streams, "") as http:
        await asyncio.gather(*(_stream(http, url, 4) for _ in range(streams)))  # warm up
        before, began = cpu_now(), time.perf_counter()
        chunks = 0
        for _ in range(rounds):
            done = await asyncio.gather(*(_stream(http, url, tokens) for _ in range(streams)))
            chunks += sum(done)
        cpu, wall = cpu_now() - before, time.perf_counter() - began
    return _figure("http/1.1 sse", streams, chunks, cpu, wall)


def _figure(transport: str, streams: int, messages: int, cpu: float, wall: float) -> Figure:
    return {
        "transport": transport, "streams": streams, "messages": messages,
        "us_per_message": round(cpu / messages * 1e6, 2), "messages_per_s": round(messages / wall),
    }  # fmt: skip


async def _sidecar(upstream: int, env: dict[str, str]) -> tuple[Any, str, Any]:
    side, (port, _), _ = await listening(
        "serve", "--port", "0", "--metrics-port", "0", "--upstream",
        f"http://127.0.0.1:{upstream}", "--gpu-sample-interval", "0",
        "--engine-scrape-interval", "0", pattern=SERVE, env=env,
    )  # fmt: skip
    logs = asyncio.ensure_future(_drain(side.stdout))
    return side, f"127.0.0.1:{port}", logs


async def run(streams: list[int], rounds: int, tokens: int) -> list[Figure]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMOBS_")}
    sim, (grpc_port,), said = await listening(
        "sim", "--port", "0", "--grpc-port", "0", "--decode-base", "0", "--decode-per-seq", "0",
        "--prefill-base", "0", "--prefill-per-token", "0", "--max-batch", "512",
        "--output-tokens-min", "4096", "--output-tokens-max", "4096",
        pattern=GRPC_LINE, env=env,
    )  # fmt: skip
    found = re.search(SIM, said)
    assert found is not None, said
    http_port = int(found.group(1))
    sim_logs = asyncio.ensure_future(_drain(sim.stdout))
    sse, sse_url, _ = await _sidecar(http_port, env)
    grpc, grpc_url, _ = await _sidecar(grpc_port, env)
    results = []
    try:
        for n in streams:
            results.append(await measure_sse(f"http://{sse_url}", functools.partial(
                cpu_seconds, sse.pid), n, rounds, tokens))  # fmt: skip
            results.append(await measure_grpc(grpc_url, functools.partial(
                cpu_seconds, grpc.pid), n, rounds, tokens))  # fmt: skip
    finally:
        for proc in (sse, grpc, sim):
            proc.terminate()
            await proc.wait()
        await sim_logs
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="16,128", help="concurrent streams, comma-separated")
    parser.add_argument("--rounds", type=int, default=4, help="waves of streams per figure")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    for figure in asyncio.run(run(streams, args.rounds, args.tokens)):
        print(json.dumps(figure))


if __name__ == "__main__":
    main()
