"""Soak: a long streaming load through a sidecar, its RSS and open fds sampled all along.

Not a test (``tests/e2e/test_soak.py`` runs a short version of it): run it by hand and record the
result in docs/benchmarks.md.

Three processes: the simulated engine in a fast mode (no prefill, a tiny decode step), the
sidecar (``llmobs serve``), and this driver, which is the client: ``--concurrency`` streams
at once, each a chat request for exactly ``--tokens`` tokens, ``--requests`` in all. Every
``--sample`` seconds it reads the sidecar's RSS and open fds from ``/proc/<pid>``. At the end
it compares three independent counts: the requests the client saw complete (a clean end,
``[DONE]``), the sidecar's ``llmobs_requests_total`` and the engine's
``vllm:request_success_total``; and the tokens the client counted with the sidecar's.

    python benchmarks/soak.py                          # 50,000 requests x 20 tokens
    python benchmarks/soak.py --requests 2000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
TOKEN = b'"delta":{"content":" '  # every sim token is a word with a leading space: one per event


@dataclass
class Sample:
    t: float  # seconds since the load started
    done: int  # requests finished by then
    rss_mib: float
    fds: int


@dataclass
class Report:
    requests: int
    tokens_per_request: int
    concurrency: int
    duration_s: float = 0.0
    client_ok: int = 0
    client_failed: int = 0
    client_tokens: int = 0
    sidecar_requests: float = 0.0
    sidecar_ok: float = 0.0
    sidecar_output_tokens: float = 0.0
    engine_completed: float = 0.0
    idle: Sample | None = None  # before the load
    samples: list[Sample] = field(default_factory=list)

    @property
    def counts_agree(self) -> bool:
        n, tokens = self.requests, self.requests * self.tokens_per_request
        requests = {self.client_ok, self.sidecar_requests, self.sidecar_ok, self.engine_completed}
        return requests == {n} and self.client_tokens == self.sidecar_output_tokens == tokens

    def sample(self, t: float, pid: int) -> Sample:
        done = self.client_ok + self.client_failed
        return Sample(round(t, 2), done, round(rss_mib(pid), 1), open_fds(pid))

    def at(self, fraction: float) -> Sample:
        """The sample at ``fraction`` of the load (0: first, 1: last)."""
        return self.samples[min(len(self.samples) - 1, int(fraction * (len(self.samples) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def start(log: Path, args: list[str]) -> subprocess.Popen[bytes]:
    """``python -m llmobs ARGS`` in its own process; its output goes to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "llmobs", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 30.0
    while True:
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} never answered")
        await asyncio.sleep(0.1)


async def scrape(
    session: aiohttp.ClientSession, url: str
) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with session.get(url) as r:
        text = await r.text()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def total(
    metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    return sum(
        v for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


async def drive(report: Report, proxy: str, sidecar_pid: int, interval: float) -> None:
    body = json.dumps({
        "model": "soak", "messages": [{"role": "user", "content": "hello there"}], "stream": True,
        "max_tokens": report.tokens_per_request, "ignore_eos": True,
    }).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}
    issued = 0
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal issued
        while issued < report.requests:
            issued += 1
            try:
                async with session.post(
                    proxy + "/v1/chat/completions", data=body, headers=headers
                ) as r:
                    data = await r.read()
                ok = r.status == 200 and data.endswith(b"data: [DONE]\n\n")
            except aiohttp.ClientError:
                ok, data = False, b""
            report.client_ok += ok
            report.client_failed += not ok
            report.client_tokens += data.count(TOKEN)

    async def sampler() -> None:
        while True:
            report.samples.append(report.sample(loop.time() - started, sidecar_pid))
            await asyncio.sleep(interval)

    connector = aiohttp.TCPConnector(limit=report.concurrency)
    sampling = asyncio.ensure_future(sampler())
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(report.concurrency)))
    report.duration_s = round(loop.time() - started, 2)
    sampling.cancel()
    report.samples.append(report.sample(report.duration_s, sidecar_pid))


async def soak(requests: int, tokens: int, concurrency: int, interval: float, logs: Path) -> Report:
    report = Report(requests, tokens, concurrency)
    sim_port, proxy_port, metrics_port = free_port(), free_port(), free_port()
    fast = "--prefill-base 0 --prefill-per-token 0 --decode-base 0.0005 --decode-per-seq 0"
    sim = start(
        logs / "sim.log",
        f"sim --host 127.0.0.1 --port {sim_port} --max-batch 256 {fast}".split(),
    )
    sidecar = start(
        logs / "sidecar.log",
        f"serve --upstream http://127.0.0.1:{sim_port} --host 127.0.0.1 --port {proxy_port} "
        f"--metrics-host 127.0.0.1 --metrics-port {metrics_port} --gpu-sample-interval 0 "
        "--engine-scrape-interval 0 --log-level warning".split(),
    )
    try:
        async with aiohttp.ClientSession() as s:
            await wait_ready(s, f"http://127.0.0.1:{sim_port}/health")
            await wait_ready(s, f"http://127.0.0.1:{metrics_port}/healthz")
        report.idle = report.sample(0.0, sidecar.pid)
        await drive(report, f"http://127.0.0.1:{proxy_port}", sidecar.pid, interval)
        await asyncio.sleep(0.5)  # the last requests' bookkeeping
        async with aiohttp.ClientSession() as s:
            side = await scrape(s, f"http://127.0.0.1:{metrics_port}/metrics")
            engine = await scrape(s, f"http://127.0.0.1:{sim_port}/metrics")
        report.sidecar_requests = total(side, "llmobs_requests_total")
        report.sidecar_ok = total(side, "llmobs_requests_total", outcome="ok")
        report.sidecar_output_tokens = total(
            side, "llmobs_tokens_total", gen_ai_token_type="output"
        )
        report.engine_completed = total(engine, "vllm:request_success_total")
    finally:
        for proc in (sidecar, sim):
            proc.send_signal(signal.SIGTERM)
        for proc in (sidecar, sim):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return report


def summary(r: Report) -> str:
    rows = [
        f"{r.requests} requests x {r.tokens_per_request} tokens, {r.concurrency} at once: "
        f"{r.duration_s:.1f} s, {r.requests / r.duration_s:,.0f} requests/s, "
        f"{r.client_tokens / r.duration_s:,.0f} tokens/s",
        f"counts: client ok {r.client_ok} (failed {r.client_failed}), sidecar "
        f"{r.sidecar_requests:.0f} (ok {r.sidecar_ok:.0f}), engine {r.engine_completed:.0f}; "
        f"tokens: client {r.client_tokens}, sidecar {r.sidecar_output_tokens:.0f}; "
        f"{'AGREE' if r.counts_agree else 'DISAGREE'}",
    ]
    if r.idle:
        rows.append(f"sidecar idle: RSS {r.idle.rss_mib} MiB, {r.idle.fds} fds")
    for name, fraction in (
        ("start", 0.0),
        ("25%", 0.25),
        ("middle", 0.5),
        ("75%", 0.75),
        ("end", 1.0),
    ):
        s = r.at(fraction)
        rows.append(
            f"{name:>6} t={s.t:7.1f}s done={s.done:6d}  RSS {s.rss_mib:6.1f} MiB  fds {s.fds}"
        )
    peak = max(r.samples, key=lambda s: s.rss_mib)
    rows.append(f"peak RSS {peak.rss_mib} MiB at t={peak.t}s; fds {min(s.fds for s in r.samples)}"
                f"..{max(s.fds for s in r.samples)}")  # fmt: skip
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--tokens", type=int, default=20, help="tokens per request")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sample", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="write the report here too")
    parser.add_argument("--logs", type=Path, help="keep the engine's and sidecar's logs here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        try:
            report = asyncio.run(
                soak(args.requests, args.tokens, args.concurrency, args.sample, logs)
            )
        except Exception:
            for log in sorted(logs.glob("*.log")):
                print(f"--- {log.name}", log.read_text(errors="replace")[-3000:], sep="\n")
            raise
    print(summary(report))
    if args.json:
        args.json.write_text(json.dumps({**asdict(report), "counts_agree": report.counts_agree}))
    return 0 if report.counts_agree else 1


if __name__ == "__main__":
    sys.exit(main())
