"""``llmobs capacity`` against the simulated engine, whose capacity is known from its settings:
the knee it finds is within 10 % of the analytic one, and the cause it names is the one the
settings make (the queue, prefill, preemptions). The engine, the sidecar and the search run
as a pod and an operator would run them: three processes.

The sim runs at half the pace of its defaults (every step half as long, the bounds halved
with them: the knees do not move) so that the three searches take a minute and a half.
With every client starting at once and every request the same length, the clients move in
step, a cohort at a time, and the analytic knees are those of cohorts:

* queue-bound: a batch of B and a TTFT bound below one service time: at B + 1 clients one
  request in B + 1 waits a whole service, more than the 5 % the p95 leaves out: knee B.
* prefill-bound: no queue (B far above the load), long prompts: each cohort's prompts are
  prefilled together before any first token, so TTFT is C x p: knee T / p.
* preemption-bound: a KV cache of K tokens: C requests of P + O tokens fit while C (P + O)
  <= K; one more and the latest admitted is preempted mid-stream, waits for room, and its
  longest gap breaks the bound: knee K / (P + O).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.ports import SERVE, SIM, running
from tests.support.processes import ROOT

PACE = {"decode_base": 0.0075, "decode_per_seq": 0.00025}  # half the sim's defaults


@dataclass(frozen=True)
class Setting:
    """A sim configuration, the objectives searched against, and what theory says."""

    sim: dict[str, float]
    prompt: int
    output: int
    bounds: dict[str, float]
    cause: str

    def analytic(self) -> float:
        s = self.sim
        if self.cause == "queue":
            return s["max_batch"]
        if self.cause == "prefill":
            return self.bounds["ttft"] / (s["prefill_base"] + s["prefill_per_token"] * self.prompt)
        return s["kv_capacity"] / (self.prompt + self.output)


SETTINGS = {
    "queue": Setting(
        {"max_batch": 6, "prefill_base": 0.0025, "prefill_per_token": 0.00005, **PACE},
        50, 64, {"ttft": 0.25, "tpot": 0.05}, "queue",
    ),
    "prefill": Setting(
        {"max_batch": 64, "prefill_base": 0.01, "prefill_per_token": 0.0001, **PACE},
        1000, 32, {"ttft": 1.05, "tpot": 0.1}, "prefill",
    ),
    "preemption": Setting(
        {"max_batch": 64, "prefill_base": 0.0025, "prefill_per_token": 0.00001,
         "kv_capacity": 3000, **PACE},
        200, 100, {"ttft": 1.0, "max_gap": 0.1}, "preemption",
    ),
}  # fmt: skip


def _flags(values: dict[str, float]) -> list[str]:
    return [part for k, v in values.items() for part in (f"--{k.replace('_', '-')}", f"{v:g}")]


@contextlib.asynccontextmanager
async def pod(sim: dict[str, float]) -> AsyncIterator[tuple[str, str]]:
    """The sim behind a sidecar (its engine gauges read twice a second): the proxy's URL and
    the sidecar's /metrics."""
    env = {**os.environ, "LLMOBS_HOST": "127.0.0.1", "LLMOBS_METRICS_HOST": "127.0.0.1"}
    sim_ = running("sim", "--port", "0", "--per-request-metrics", *_flags(sim),
                   pattern=SIM, env=env)  # fmt: skip
    async with sim_ as (sim_port,), running(
        "serve", "--port", "0", "--metrics-port", "0", "--upstream",
        f"http://127.0.0.1:{sim_port}", "--engine-scrape-interval", "0.5",
        pattern=SERVE, env=env,
    ) as (port, metrics_port):  # fmt: skip
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"


async def capacity(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", "capacity", *argv, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("name", list(SETTINGS))
async def test_the_knee_and_its_cause_match_the_engine_s_settings(
    name: str, tmp_path: Path
) -> None:
    setting = SETTINGS[name]
    bounds = _flags({k.replace("_", "-"): v for k, v in setting.bounds.items()})
    async with pod(setting.sim) as (url, metrics):
        code, out, err = await capacity(
            "--url", url, "--metrics-url", metrics, "--workload",
            f"fixed:{setting.prompt},{setting.output}", *bounds, "--quantile", "0.95",
            "--start", "4", "--requests", "12", "--rounds", "2", "--out", str(tmp_path / "c"),
        )  # fmt: skip
    assert code == 0, err
    found = json.loads((tmp_path / "c.json").read_text())
    analytic = setting.analytic()
    assert abs(found["knee"] - analytic) <= 0.1 * analytic, (found["knee"], analytic, err)
    assert found["cause"]["name"] == setting.cause, (found["cause"], err)
    assert found["failed"] == found["knee"] + 1  # one client apart: the search ran to the end
    # every level in the table, the JSON and the CSV; progress said for each as it ran
    rows = list(csv.DictReader((tmp_path / "c.csv").read_text().splitlines()))
    assert [float(r["load"]) for r in rows] == [lv["load"] for lv in found["levels"]]
    assert err.count("] load ") == len(rows)
    assert f"knee: {found['knee']:g} clients" in out
    assert f"what bends it: {setting.cause}:" in out
    held = [lv for lv in found["levels"] if lv["holds"]]
    assert all(lv["load"] <= found["knee"] for lv in held)
    assert all(lv["cause"] for lv in found["levels"] if not lv["holds"])
