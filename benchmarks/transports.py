"""What each transport costs the sidecar per relayed chunk: HTTP/1.1, HTTP/1.1 over TLS, HTTP/2
with prior knowledge (h2c) and HTTP/2 over TLS, at a given number of concurrent streams.

Not a test: run it by hand (``python benchmarks/transports.py --streams 16,128``) and record
the figures in docs/benchmarks.md with the machine they came from. Each party is a process:
the simulated engine (``llmobs sim``, no decode delay), one ``llmobs serve`` per transport in
front of it, and the clients (httpx, this process: one connection per stream over HTTP/1.1,
one connection for all streams over HTTP/2). The sidecar's CPU time (user + system, from
/proc/<pid>/stat) over the run, divided by the content chunks the clients read, is the figure.

Beside it, the plain-C baseline: nginx speaking the same transport to the same clients (one
nginx per transport, ``llmobs bench``'s config from ``llmobs.bench.targets.nginx_config``:
one worker, plain HTTP/1.1 to the sim over a keep-alive pool, nothing buffered), its listener
given ``ssl`` and/or HTTP/2 (``listen ... http2`` before nginx 1.25.1, ``http2 on`` from it),
TLS 1.2 or later as the sidecar's. Its figure is the CPU time of its process group (master and
worker) per chunk. Each wave of streams goes to each relay in turn, so both see the same
machine at nearly the same time: compare them within a run (``--relays llmobs,nginx``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import trustme

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmobs.bench.targets import nginx_config  # noqa: E402
from tests.support.ports import SERVE, SIM, free_port, listening  # noqa: E402

TRANSPORTS = ("http1", "http1-tls", "h2c", "h2-tls")
RELAYS = ("llmobs", "nginx")
TICKS = os.sysconf("SC_CLK_TCK")
Figure = dict[str, object]


def _stat(pid: int | str) -> list[str]:
    """/proc/<pid>/stat's fields after the command name: state, ppid, pgrp, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS


def group_cpu_seconds(pgid: int) -> float:
    """The CPU time of every process in the group ``pgid`` (nginx: its master and workers)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(entry)
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


async def _stream(
    http: httpx.AsyncClient, url: str, tokens: int, seen: set[str] | None = None
) -> int:
    body = {"model": "m", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    chunks = 0
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        if seen is not None:
            seen.add(resp.http_version)
        async for line in resp.aiter_lines():
            chunks += line.startswith("data: {")
    return chunks


def _client(transport: str, streams: int, ca: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    verify: str | bool = ca if transport.endswith("tls") else False
    h2 = transport.startswith("h2")
    return httpx.AsyncClient(http1=not h2 or transport == "h2-tls", http2=h2, verify=verify,
                             limits=limits, timeout=30)  # fmt: skip


@dataclass
class Relay:
    """A relay in front of the sim (a sidecar, or one nginx): its process, URL and CPU time."""

    name: str
    proc: asyncio.subprocess.Process
    url: str
    cpu: Callable[[], float]
    output: asyncio.Future[bytes] | Path  # the sidecar's drained pipe; nginx's log file

    async def tail(self, size: int = 2000) -> str:
        """The end of what it wrote (a sidecar's only once it has ended)."""
        if isinstance(self.output, Path):
            text = "".join(f.read_text(errors="replace") for f in sorted(self.output.glob("*.log")))
        else:
            text = (await self.output).decode(errors="replace")
        return text[-size:]


async def measure(
    relay: Relay, transport: str, streams: int, rounds: int, ca: str, tokens: int = 256
) -> Figure:
    """``rounds`` waves of ``streams`` concurrent streams: the relay's CPU per chunk."""
    url, cpu_now = relay.url, relay.cpu
    async with _client(transport, streams, ca) as http:
        seen: set[str] = set()  # the protocol the relay answered in
        await asyncio.gather(*(_stream(http, url, 4, seen) for _ in range(streams)))  # warm up
        before, began = cpu_now(), time.perf_counter()
        chunks = 0
        for _ in range(rounds):
            done = await asyncio.gather(*(_stream(http, url, tokens) for _ in range(streams)))
            chunks += sum(done)
        cpu, wall = cpu_now() - before, time.perf_counter() - began
    return {
        "relay": relay.name, "transport": transport, "http": ",".join(sorted(seen)),
        "streams": streams, "chunks": chunks,
        "us_per_chunk": round(cpu / chunks * 1e6, 2), "chunks_per_s": round(chunks / wall),
    }  # fmt: skip


async def _drain(stream: asyncio.StreamReader | None) -> bytes:
    return await stream.read() if stream is not None else b""


def nginx_version(nginx: str) -> tuple[int, int, int]:
    said = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=True).stderr
    found = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", said)
    if found is None:
        raise RuntimeError(f"cannot read nginx's version in {said!r}")
    major, minor, patch = map(int, found.groups())
    return major, minor, patch


def nginx_transport_config(
    workdir: Path, port: int, upstream: int, transport: str, certs: Path,
    version: tuple[int, int, int],
) -> str:  # fmt: skip
    """``llmobs bench``'s nginx config with its listener speaking ``transport``: ``ssl`` with
    the sidecar's certificate (TLS 1.2 or later, as the sidecar), HTTP/2 by prior knowledge on
    a plain port, by ALPN over TLS (then the request body buffered: below)."""
    conf = nginx_config(workdir, port, upstream)
    listen = f"listen 127.0.0.1:{port}"
    if conf.count(listen + ";") != 1:
        raise RuntimeError(f"no single '{listen};' in llmobs.bench.targets.nginx_config's")
    tls, h2 = transport.endswith("tls"), transport.startswith("h2")
    separate = version >= (1, 25, 1)  # "http2 on;" from 1.25.1, "listen ... http2" before
    directives = [listen + " ssl" * tls + " http2" * (h2 and not separate) + ";"]
    if h2 and separate:
        directives.append("http2 on;")
    if tls:
        directives += [
            f"ssl_certificate {certs / 'c.pem'};", f"ssl_certificate_key {certs / 'k.pem'};",
            "ssl_protocols TLSv1.2 TLSv1.3;",
        ]  # fmt: skip
    if h2:
        # httpcore ends a request's stream in an empty DATA frame after its body; unbuffered,
        # nginx may answer a short stream in full and reset it (NO_ERROR) in between, which
        # httpcore reports as its own protocol error (StreamClosedError). nginx's default,
        # the whole body (END_STREAM) before the engine is asked, as the sidecar does
        conf = conf.replace("proxy_request_buffering off;", "proxy_request_buffering on;")
    return conf.replace(listen + ";", "\n    ".join(directives))


async def start_nginx(
    nginx: str, transport: str, upstream: int, certs: Path, version: tuple[int, int, int]
) -> Relay:
    """One nginx speaking ``transport``, in its own session (its group: master and worker),
    once it accepts connections."""
    workdir = certs / f"nginx-{transport}"
    workdir.mkdir()
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(nginx_transport_config(workdir, port, upstream, transport, certs, version))
    with (workdir / "nginx-out.log").open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            nginx, "-p", str(workdir), "-c", str(conf), stdin=asyncio.subprocess.DEVNULL,
            stdout=out, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    scheme = "https" if transport.endswith("tls") else "http"
    relay = Relay("nginx", proc, f"{scheme}://127.0.0.1:{port}",
                  functools.partial(group_cpu_seconds, proc.pid), workdir)  # fmt: skip
    for _ in range(200):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return relay
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.05)
        if proc.returncode is not None:
            break
    await stop(relay)
    raise RuntimeError(f"nginx ({transport}) did not listen on {port}:\n{await relay.tail()}")


async def start_sidecars(upstream: int, certs: Path, env: dict[str, str]) -> dict[str, Relay]:
    """Two ``llmobs serve``: one plain (HTTP/1.1 and h2c), one over TLS (ALPN h2 or
    http/1.1); by transport."""
    tls = ["--tls-cert-file", str(certs / "c.pem"), "--tls-key-file", str(certs / "k.pem")]
    by_transport = {}
    for secure in (False, True):
        side, (port, _), _ = await listening(
            "serve", "--port", "0", "--metrics-port", "0", "--upstream",
            f"http://127.0.0.1:{upstream}", "--gpu-sample-interval", "0",
            "--engine-scrape-interval", "0", *(tls if secure else []), pattern=SERVE, env=env,
        )  # fmt: skip
        url = f"{'https' if secure else 'http'}://127.0.0.1:{port}"
        logs = asyncio.ensure_future(_drain(side.stdout))  # (a full pipe would block it)
        relay = Relay("llmobs", side, url, functools.partial(cpu_seconds, side.pid), logs)
        for transport in ("http1-tls", "h2-tls") if secure else ("http1", "h2c"):
            by_transport[transport] = relay
    return by_transport


async def stop(relay: Relay) -> None:
    """SIGTERM (nginx: to its whole group), SIGKILL after 10 s."""
    proc, group = relay.proc, isinstance(relay.output, Path)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.returncode is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
    await proc.wait()


async def end(relay: Relay) -> None:
    """Stop it; a sidecar's exit code and last words, or any relay's that ended by itself."""
    ended = relay.proc.returncode
    await stop(relay)
    if relay.name == "llmobs" or ended is not None:
        print(f"{relay.name} ({relay.url}) ended: {relay.proc.returncode}"
              + (" (by itself, before the stop)" if ended is not None else ""),
              file=sys.stderr)  # fmt: skip
        print(await relay.tail(), file=sys.stderr)


async def attempt(
    relay: Relay, transport: str, streams: int, rounds: int, ca: str
) -> Figure | None:
    """``measure``, or None with what went wrong: a relay that ended is said so, with its exit
    code and the end of its output, and skipped from then on."""
    if relay.proc.returncode is not None:
        print(f"{relay.name} {transport} {streams}: skipped, it has ended", file=sys.stderr)
        return None
    try:
        return await measure(relay, transport, streams, rounds, ca)
    except (httpx.HTTPError, OSError) as exc:
        print(f"{relay.name} {transport} {streams}: failed: {exc!r}", file=sys.stderr)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(relay.proc.wait(), 2)
    if relay.proc.returncode is not None:
        print(f"{relay.name} ({relay.url}) vanished: exit code {relay.proc.returncode}",
              file=sys.stderr)  # fmt: skip
        print(await relay.tail(), file=sys.stderr)
    return None


async def run(streams: list[int], rounds: int, relays: list[str]) -> list[Figure]:
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
    # an access-log line a request: a full pipe would stall the sim, and every stream with it
    sim_logs = asyncio.ensure_future(_drain(sim.stdout))
    parties: dict[tuple[str, str], Relay] = {}
    results = []
    try:
        if "llmobs" in relays:
            sidecars = await start_sidecars(sim_port, folder, env)
            parties.update({("llmobs", t): relay for t, relay in sidecars.items()})
        if "nginx" in relays:
            nginx = shutil.which("nginx") or "nginx"
            version = nginx_version(nginx)
            for t in TRANSPORTS:
                parties["nginx", t] = await start_nginx(nginx, t, sim_port, folder, version)
        for transport in TRANSPORTS:  # each wave size to each relay in turn
            for n in streams:
                for name in relays:
                    figure = await attempt(
                        parties[name, transport], transport, n, rounds, str(folder / "ca.pem")
                    )
                    if figure is not None:
                        results.append(figure)
                        print(json.dumps(figure), flush=True)
    finally:
        for relay in {id(r): r for r in parties.values()}.values():
            await end(relay)
        if sim.returncode is not None:
            said = (await sim_logs).decode(errors="replace")[-2000:]
            print(f"sim ended by itself: {sim.returncode}\n{said}", file=sys.stderr)
        sim.terminate()
        await sim.wait()
    return results


def table(results: list[Figure]) -> str:
    """Markdown: per transport and stream count, each relay's µs of CPU per chunk, and the
    sidecar's over nginx's."""
    us = {(f["relay"], f["transport"], f["streams"]): f["us_per_chunk"] for f in results}
    rows = ["| transport | streams | llmobs µs/chunk | nginx µs/chunk | llmobs/nginx |",
            "|---|---:|---:|---:|---:|"]  # fmt: skip
    for transport, streams in dict.fromkeys((f["transport"], f["streams"]) for f in results):
        ours, theirs = us.get(("llmobs", transport, streams)), us.get(("nginx", transport, streams))
        ratio = (
            f"{ours / theirs:.1f}x"
            if isinstance(ours, float) and isinstance(theirs, float) and theirs
            else "-"
        )
        rows.append(f"| {transport} | {streams} | {ours or '-'} | {theirs or '-'} | {ratio} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="16,128", help="concurrent streams, comma-separated")
    parser.add_argument("--rounds", type=int, default=4, help="waves of streams per figure")
    parser.add_argument("--relays", default=",".join(RELAYS),
                        help=f"relays, comma-separated ({', '.join(RELAYS)})")  # fmt: skip
    args = parser.parse_args()
    relays = [r for r in args.relays.split(",") if r]
    if unknown := set(relays) - set(RELAYS):
        parser.error(f"unknown relays: {', '.join(sorted(unknown))}")
    if "nginx" in relays and not shutil.which("nginx"):
        parser.error("nginx not found on PATH (apt-get install nginx), or --relays llmobs")
    results = asyncio.run(run([int(n) for n in args.streams.split(",")], args.rounds, relays))
    print(table(results))


if __name__ == "__main__":
    main()
