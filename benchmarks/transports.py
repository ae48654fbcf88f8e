"""What each transport costs the sidecar per relayed chunk: HTTP/1.1, HTTP/1.1 over TLS, HTTP/2
with prior knowledge (h2c) and HTTP/2 over TLS, at a given number of concurrent streams.

Not a test: run it by hand (``python benchmarks/transports.py --streams 16,128``) and record
the figures in docs/benchmarks.md with the machine they came from. Each party is a process:
the simulated engine (``llmobs sim``, no decode delay), one ``llmobs serve`` per transport in
front of it, and the clients (httpx, this process: one connection per stream over HTTP/1.1,
one connection for all streams over HTTP/2). The sidecar's CPU time (user + system, from
/proc/<pid>/stat) over the run, divided by the content chunks the clients read, is the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trustme

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.ports import SERVE, SIM, listening  # noqa: E402

TRANSPORTS = ("http1", "http1-tls", "h2c", "h2-tls")
TICKS = os.sysconf("SC_CLK_TCK")
Figure = dict[str, object]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def _stream(http: httpx.AsyncClient, url: str, tokens: int) -> int:
    body = {"model": "m", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    chunks = 0
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            chunks += line.startswith("data: {")
    return chunks


def _client(transport: str, streams: int, ca: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    verify: str | bool = ca if transport.endswith("tls") else False
    h2 = transport.startswith("h2")
    return httpx.AsyncClient(http1=not h2 or transport == "h2-tls", http2=h2, verify=verify,
                             limits=limits, timeout=30)  # fmt: skip


async def measure(transport: str, url: str, pid: int, streams: int, rounds: int, ca: str) -> Figure:
    """``rounds`` waves of ``streams`` concurrent streams: the sidecar's CPU per chunk."""
    tokens = 256
    async with _client(transport, streams, ca) as http:
        await asyncio.gather(*(_stream(http, url, 4) for _ in range(streams)))  # warm up
        before, began = cpu_seconds(pid), time.perf_counter()
        chunks = 0
        for _ in range(rounds):
            done = await asyncio.gather(*(_stream(http, url, tokens) for _ in range(streams)))
            chunks += sum(done)
        cpu, wall = cpu_seconds(pid) - before, time.perf_counter() - began
    return {
        "transport": transport, "streams": streams, "chunks": chunks,
        "us_per_chunk": round(cpu / chunks * 1e6, 2), "chunks_per_s": round(chunks / wall),
    }  # fmt: skip


async def _drain(stream: asyncio.StreamReader | None) -> bytes:
    return await stream.read() if stream is not None else b""


async def run(streams: list[int], rounds: int) -> list[Figure]:
    folder = Path(tempfile.mkdtemp())
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    (folder / "c.pem").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    (folder / "k.pem").write_bytes(leaf.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMOBS_")}
    sim, (sim_port,), _ = await listening(
        "sim", "--port", "0", "--decode-base", "0", "--decode-per-seq", "0", "--prefill-base",
        "0", "--prefill-per-token", "0", "--max-batch", "512", "--output-tokens-min", "4096",
        "--output-tokens-max", "4096",
        pattern=SIM, env=env,
    )  # fmt: skip
    tls = ["--tls-cert-file", str(folder / "c.pem"), "--tls-key-file", str(folder / "k.pem")]
    results = []
    try:
        for secure in (False, True):
            side, (port, _), _ = await listening(
                "serve", "--port", "0", "--metrics-port", "0", "--upstream",
                f"http://127.0.0.1:{sim_port}", "--gpu-sample-interval", "0",
                "--engine-scrape-interval", "0", *(tls if secure else []), pattern=SERVE, env=env,
            )  # fmt: skip
            url = f"{'https' if secure else 'http'}://127.0.0.1:{port}"
            logs = asyncio.ensure_future(_drain(side.stdout))  # (a full pipe would block it)
            try:
                for transport in ("http1-tls", "h2-tls") if secure else ("http1", "h2c"):
                    for n in streams:
                        results.append(
                            await measure(
                                transport, url, side.pid, n, rounds, str(folder / "ca.pem")
                            )
                        )
                        print(json.dumps(results[-1]), flush=True)
            finally:
                side.terminate()
                await side.wait()
                print(f"sidecar ended: {side.returncode}", file=sys.stderr)
                print((await logs).decode(errors="replace")[-2000:], file=sys.stderr)
    finally:
        sim.terminate()
        await sim.wait()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="16,128", help="concurrent streams, comma-separated")
    parser.add_argument("--rounds", type=int, default=4, help="waves of streams per figure")
    args = parser.parse_args()
    asyncio.run(run([int(n) for n in args.streams.split(",")], args.rounds))


if __name__ == "__main__":
    main()
