"""``llmobs bench``: a short real run (its arithmetic and its load: ``tests/unit/bench/``).

The run starts real processes (the sim, ``llmobs serve``) on loopback for about ten seconds:
every figure the JSON promises must be there for every cell, chunks out must equal chunks in,
and the figures must be of the right sign and finite. Whether the goals are met is the
bench's business (docs/benchmarks.md), not a test's: this machine's timing is not asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmobs.bench import BenchOptions, run_bench
from llmobs.bench.report import plot, summarize, table, to_json

CELL_FIELDS = (
    "round", "target", "concurrency", "tpot_ms", "wall_s", "requests", "ok", "chunks",
    "ttft_p50_ms", "ttft_p99_ms", "ttft_path_p50_ms", "ttft_path_p99_ms", "delay_p50_ms",
    "delay_p99_ms", "delay_max_ms", "gap_p50_ms", "jitter_ms", "gap_added_jitter_ms",
    "failed", "dropped", "engine_chunks", "chunks_match", "chunks_per_s", "cpu_s",
    "cpu_us_per_chunk", "cpu_us_per_request", "cpu_system_share", "cpu_user_us_per_chunk",
    "rss_idle_mib", "rss_per_active_stream_kib", "scrape",
)  # fmt: skip
# the figures added by the sidecar, and the cells' figures each is the difference of
ADDED = {"added_delay_p50_ms": "delay_p50_ms", "added_delay_p99_ms": "delay_p99_ms",
         "added_ttft_p50_ms": "ttft_path_p50_ms"}  # fmt: skip
SUMMARY_FIELDS = (
    "added_ttft_p50_ms", "added_ttft_p99_ms", "added_delay_p50_ms", "added_delay_p99_ms",
    "added_jitter_ms", "chunks_per_s", "cpu_us_per_chunk", "cpu_us_per_request",
    "scrape_gap_added_during_p99_ms", "scrape_gap_added_during_max_ms", "chunks_match",
    "delay_p50_vs_direct", "cpu_us_per_chunk_vs_nginx", "cpu_system_share",
    "cpu_user_us_per_chunk", "cpu_user_us_per_chunk_vs_nginx",
)  # fmt: skip


async def test_short_bench_run_reports_every_figure(tmp_path: Path) -> None:
    options = BenchOptions(
        targets=("direct", "llmobs"), concurrency=(1, 4), rounds=1, tokens=5, tpot=0.005,
        duration=0.6, scrape_interval=0.2, saturation_streams=4, saturation_tokens=(30, 5),
        saturation_duration=0.3, open_streams=20, pin=False,
    )  # fmt: skip
    result = await run_bench(options, tmp_path / "work")
    summary = summarize(result)
    data = json.loads(to_json(result, summary))
    assert data["machine"]["cpus"] >= 1
    assert {(c["target"], c["concurrency"]) for c in data["cells"]} == {
        ("direct", 1), ("direct", 4), ("llmobs", 1), ("llmobs", 4)
    }  # fmt: skip
    for cell in data["cells"]:
        assert set(CELL_FIELDS) <= set(cell), cell["target"]
        assert cell["failed"] == 0
        assert cell["chunks"] > 0
        assert cell["chunks_match"] and cell["chunks"] == cell["engine_chunks"]
        assert cell["chunks"] == 5 * cell["requests"]
        assert 0 < cell["delay_p50_ms"] < 1000
    llmobs = [c for c in data["cells"] if c["target"] == "llmobs"]
    assert all(c["cpu_us_per_chunk"] > 0 and c["scrape"]["scrapes"] >= 1 for c in llmobs)
    for c in llmobs:  # the kernel's share, where 10 ms ticks saw any CPU at all
        share = c["cpu_system_share"]
        assert share is None or 0 <= share <= 1
        assert share is None or c["cpu_user_us_per_chunk"] == pytest.approx(
            c["cpu_us_per_chunk"] * (1 - share)
        )
    assert all(c["cpu_us_per_chunk"] is None for c in data["cells"] if c["target"] == "direct")
    cells = {(c["target"], c["concurrency"]): c for c in data["cells"]}
    for row in data["summary"]["paced"]:
        assert set(SUMMARY_FIELDS) <= set(row)
        if row["target"] == "llmobs":  # against the direct run of the same round and level
            # (not a sign: the two ran at different moments of a machine others load)
            level = row["concurrency"]
            target, direct = cells[("llmobs", level)], cells[("direct", level)]
            for name, source in ADDED.items():
                assert row[name] == pytest.approx(target[source] - direct[source]), name
    sat = {s["target"]: s for s in data["saturation"]}
    assert sat["llmobs"]["tokens_30"]["chunks"] > 0 and sat["llmobs"]["open_streams"] == 20
    assert sat["llmobs"]["rss_per_open_stream_kib"] is not None
    assert sat["llmobs"]["fit_cpu_us_per_chunk"] is not None
    text = table(result, summary)
    assert "llmobs" in text and "saturation" in text
    why = plot(summary, tmp_path / "bench.png")
    assert why is not None or (tmp_path / "bench.png").stat().st_size > 0
