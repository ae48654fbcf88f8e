"""A short soak (``benchmarks/soak.py``): the engine, the sidecar and the client each in their
own process, 2,000 streamed requests. No request lost or counted twice, and the sidecar's open
fds and RSS stay flat while it serves them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import ROOT

REQUESTS, TOKENS, CONCURRENCY = 2000, 20, 32


def at(report: dict[str, Any], fraction: float) -> dict[str, Any]:
    samples: list[dict[str, Any]] = report["samples"]
    return samples[min(len(samples) - 1, int(fraction * (len(samples) - 1)))]


def test_short_soak_counts_agree_and_the_sidecar_stays_flat(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--requests", str(REQUESTS),
               "--tokens", str(TOKENS), "--concurrency", str(CONCURRENCY), "--sample", "0.25",
               "--json", str(out)]  # fmt: skip
    done = subprocess.run(
        command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    # Zero lost or double-counted: the client's, the sidecar's and the engine's counts agree.
    assert report["client_ok"] == REQUESTS
    assert report["client_failed"] == 0
    assert report["sidecar_requests"] == report["sidecar_ok"] == REQUESTS
    assert report["engine_completed"] == REQUESTS
    assert report["client_tokens"] == report["sidecar_output_tokens"] == REQUESTS * TOKENS
    # Flat: once the connections are open, no more fds; RSS within a generous bound.
    idle, warm, end = report["idle"], at(report, 0.25), at(report, 1.0)
    assert max(s["fds"] for s in report["samples"]) <= idle["fds"] + 2 * CONCURRENCY + 16
    assert end["fds"] <= warm["fds"] + 4, report["samples"]
    assert end["rss_mib"] - warm["rss_mib"] < 30, report["samples"]
    assert end["rss_mib"] - idle["rss_mib"] < 60, report["samples"]
