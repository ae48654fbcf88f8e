"""``llmobs capacity`` against llama-server (two slots) through a sidecar: a short search runs
end to end and writes its curve. The engine is real, so its knee is not known in advance; what
is held to the truth here is that every level is the one asked for (its requests, each timed
by the sidecar too) and that a level above the engine's two slots that broke the objectives
says the queue broke it: the engine's own queue, as the sidecar re-exports it."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from pathlib import Path

import pytest

from tests.integration.llamacpp import LlamaServer, needs_llamacpp
from tests.support.processes import ROOT
from tests.support.servers import SidecarFactory

pytestmark = [pytest.mark.integration, needs_llamacpp]

SLOTS = 2
OUTPUT = 16


async def test_a_short_search_runs_end_to_end_and_writes_its_curve(
    engine: LlamaServer, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    side = await start_sidecar(engine.url, engine_scrape_interval=0.2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", "capacity", "--url", side.url, "--metrics-url",
        f"{side.metrics_url}/metrics", "--workload", f"fixed:32,{OUTPUT}", "--ttft", "1s",
        "--start", "1", "--max", "4", "--requests", "6", "--rounds", "1",
        "--scrape-interval", "0.25", "--out", str(tmp_path / "curve"), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode in (0, 1), err.decode()
    assert (tmp_path / "curve.json").exists(), (out.decode(), err.decode())
    doc = json.loads((tmp_path / "curve.json").read_text())
    print(out.decode())  # the curve, with pytest -rP
    levels = doc["levels"]
    assert [lv["load"] for lv in levels] == sorted(lv["load"] for lv in levels)
    assert {lv["load"] for lv in levels} >= {1.0}
    for lv in levels:
        assert lv["requests"] >= 6 and lv["errors"] == 0, lv
        assert lv["output_tokens_per_s"] > 0
        assert lv["ttft_p50_s"] > 0 and lv["tpot_p50_s"] > 0
        assert lv["holds"] or lv["cause"], lv
    assert doc["workload"]["mean_output_tokens"] == OUTPUT
    rows = list(csv.DictReader((tmp_path / "curve.csv").read_text().splitlines()))
    assert len(rows) == len(levels)
    # every request measured went through the sidecar, which timed each one's first token
    measured = sum(lv["requests"] for lv in levels)
    assert side.value("gen_ai_server_time_to_first_token_seconds_count") >= measured
    # with two slots, a third client waits in the engine's queue (its gauge, re-exported)
    broke = [lv for lv in levels if not lv["holds"] and lv["load"] > SLOTS]
    assert all(lv["cause"] in ("queue", "kv_capacity") for lv in broke), broke
