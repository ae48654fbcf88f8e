"""aiperf against the simulated engine through a sidecar, at each load of a capacity curve:
does llmobs see what aiperf sees? (docs/benchmarks.md, *The knee and the gate*)

For each concurrency, one aiperf run (fixed prompt and output lengths, ``ignore_eos``, the
server's token counts) through a fresh sidecar, whose /metrics are then read: the counts of
the same run (requests, output and input tokens) must be equal, and each of aiperf's TTFT,
TPOT (its inter-token latency: a request's decode time over its tokens after the first) and
request-latency quantiles must lie within the bucket the sidecar's histogram places that
quantile in (``histogram_quantile``: what a dashboard shows). Then ``llmobs capacity --at``
at the same load against the same engine: its quantiles against aiperf's (two runs of one
seeded engine, not one run: agreement within a few percent is what to expect).

aiperf is not a dependency of llmobs (it needs transformers and a tokenizer, which it reads
from the Hugging Face cache when offline): install it in a virtual environment of its own,
put a tokenizer in a cache (any: the server's counts are used), and give both here:

    python benchmarks/aiperf_agreement.py --aiperf /tmp/aiperf-venv/bin/aiperf \\
        --tokenizer local/simtok --hf-home /tmp/hfhome
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# the queue-bound setting of docs/benchmarks.md: a batch of 6, cheap prefill
SIM = ["--max-batch", "6", "--prefill-base", "0.005", "--prefill-per-token", "0.0001",
       "--per-request-metrics"]  # fmt: skip
PROMPT, OUTPUT = 50, 64
HISTOGRAMS = {
    "ttft": ("gen_ai_server_time_to_first_token_seconds", "time_to_first_token"),
    "tpot": ("gen_ai_server_time_per_output_token_seconds", "inter_token_latency"),
    "latency": ("gen_ai_server_request_duration_seconds", "request_latency"),
}
QUANTILES = (0.5, 0.9, 0.99)


def wait_http(url: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} never answered")


def llmobs(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "llmobs", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def page(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, float(s.value)))
    return out


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **want: str) -> float:
    return sum(v for labels, v in samples.get(name, []) if all(labels.get(k) == x
               for k, x in want.items()))  # fmt: skip


def bucket_quantile(
    samples: dict[str, list[tuple[dict[str, str], float]]], family: str, q: float
) -> tuple[float, float, float]:
    """``histogram_quantile`` of ``family``, and the bucket it fell in (low, high)."""
    cumulative: dict[float, float] = {}
    for labels, value in samples.get(family + "_bucket", []):
        le = float(labels["le"])
        cumulative[le] = cumulative.get(le, 0.0) + value
    rows = sorted(cumulative.items())
    rank = q * rows[-1][1]
    low, below = 0.0, 0.0
    for le, count in rows:
        if count >= rank:
            if math.isinf(le):
                return low, low, math.inf
            return low + (le - low) * (rank - below) / (count - below), low, le
        low, below = le, count
    return low, low, math.inf


def aiperf(args: argparse.Namespace, url: str, clients: int, out: Path) -> dict[str, Any]:
    env = {**os.environ, "HF_HOME": args.hf_home, "HF_HUB_OFFLINE": "1"}
    command = [
        args.aiperf, "profile", "--model", "sim-llama-3-8b", "--tokenizer", args.tokenizer,
        "--url", url, "--endpoint-type", "chat", "--streaming", "--concurrency", str(clients),
        "--request-count", str(args.requests), "--synthetic-input-tokens-mean", str(PROMPT),
        "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(OUTPUT),
        "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
        "--use-server-token-count", "--random-seed", "0", "--ui", "none",
        "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(out),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads((out / "profile_export_aiperf.json").read_text())
    return result


def capacity(url: str, clients: int, requests: int, out: Path) -> dict[str, Any]:
    subprocess.run(
        [sys.executable, "-m", "llmobs", "capacity", "--url", url, "--at", str(clients),
         "--workload", f"fixed:{PROMPT},{OUTPUT}", "--requests", str(requests), "--rounds", "1",
         "--ttft", "10s", "--out", str(out / "capacity")],
        check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    level: dict[str, Any] = json.loads((out / "capacity.json").read_text())["levels"][0]
    return level


def one_load(args: argparse.Namespace, clients: int, port: int, work: Path) -> dict[str, Any]:
    """One aiperf run through a fresh sidecar, its counts and quantiles against the sidecar's;
    then llmobs capacity's point at the same load."""
    side = llmobs("serve", "--upstream", f"http://127.0.0.1:{port}", "--port", "18180",
                  "--metrics-port", "18190")  # fmt: skip
    try:
        wait_http("http://127.0.0.1:18190/readyz")
        found = aiperf(args, "http://127.0.0.1:18180", clients, work / f"aiperf-{clients}")
        seen = page("http://127.0.0.1:18190/metrics")
    finally:
        side.terminate()
        side.wait()
    row: dict[str, Any] = {"clients": clients}
    row["requests"] = (found["request_count"]["avg"],
                       total(seen, "llmobs_requests_total", outcome="ok"))  # fmt: skip
    row["output_tokens"] = (found["total_osl"]["avg"], total(
        seen, "llmobs_tokens_total", gen_ai_token_type="output"))  # fmt: skip
    row["input_tokens"] = (found["total_isl"]["avg"], total(
        seen, "llmobs_tokens_total", gen_ai_token_type="input"))  # fmt: skip
    for name, (family, key) in HISTOGRAMS.items():
        for q in QUANTILES:
            theirs = found[key][f"p{q * 100:g}"] / 1000  # ms
            ours, low, high = bucket_quantile(seen, family, q)
            row[f"{name}_p{q * 100:g}"] = (theirs, ours, low <= theirs <= high)
    point = capacity(f"http://127.0.0.1:{port}", clients, args.requests, work)
    for name, key in (("ttft", "ttft"), ("tpot", "tpot")):
        for q in (0.5, 0.9):
            theirs = found[HISTOGRAMS[name][1]][f"p{q * 100:g}"] / 1000
            row[f"capacity_{key}_p{q * 100:g}"] = (point[f"{key}_p{q * 100:g}_s"], theirs)
    return row


def show(row: dict[str, Any]) -> str:
    counts = " ".join(f"{k} {a:g}/{b:g}{'' if a == b else ' DIFFER'}"
                      for k in ("requests", "output_tokens", "input_tokens")
                      for a, b in [row[k]])  # fmt: skip
    quant = " ".join(f"{k} {t * 1000:.1f}/{o * 1000:.1f}ms{'' if inside else ' OUTSIDE'}"
                     for k, v in row.items() if k[:4] in ("ttft", "tpot", "late")
                     for t, o, inside in [v])  # fmt: skip
    pairs = [(k[9:], a, b) for k, (a, b) in row.items() if k.startswith("capacity_")]
    ours = " ".join(f"{k} {a * 1000:.1f}/{b * 1000:.1f}ms ({a / b - 1:+.1%})" for k, a, b in pairs)
    head = f"{row['clients']} clients: {counts}"
    return f"{head}\n  aiperf/sidecar: {quant}\n  capacity/aiperf: {ours}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiperf", required=True, help="the aiperf command")
    parser.add_argument("--tokenizer", required=True, help="a tokenizer in --hf-home's cache")
    parser.add_argument("--hf-home", required=True, help="HF_HOME holding it")
    parser.add_argument("--loads", default="1,2,4,6,7,8", help="concurrencies [1,2,4,6,7,8]")
    parser.add_argument("--requests", type=int, default=48, help="requests per load [48]")
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args()
    sim = llmobs("sim", "--port", "18100", *SIM)
    rows = []
    try:
        wait_http("http://127.0.0.1:18100/health")
        with tempfile.TemporaryDirectory() as work:
            for clients in (int(x) for x in args.loads.split(",")):
                rows.append(one_load(args, clients, 18100, Path(work)))
                print(show(rows[-1]), flush=True)
    finally:
        sim.terminate()
        sim.wait()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    exact = all(row[k][0] == row[k][1] for row in rows
                for k in ("requests", "output_tokens", "input_tokens"))  # fmt: skip
    inside = all(v[2] for row in rows for k, v in row.items() if k[:4] in ("ttft", "tpot", "late"))
    print(f"counts exact: {exact}; every aiperf quantile inside the sidecar's bucket: {inside}")
    return 0 if exact and inside else 1


if __name__ == "__main__":
    sys.exit(main())
