"""From raw cells to the bench's report (``bench.report``), on literal cells: figures added to
``direct``'s taken round by round before the median (so a slow round of the machine's does
not show as the target's cost), absolute medians that skip what was not measured, ratios to
``direct`` and ``nginx`` only where those ran at the same level, saturation, the table (``-``
for what was not measured), JSON without NaN, and the PNG or why there is none. A real run's
report: tests/e2e/test_bench.py."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from llmobs.bench.report import ABSOLUTE, ADDED, plot, summarize, table, to_json
from llmobs.bench.runner import BenchResult

MACHINE = {"cpus": 2, "cpu_model": "Test CPU", "kernel": "6.1", "python": "3.11.7"}
OPTIONS = {"targets": ["direct", "nginx", "llmobs"], "rounds": 3, "saturation_tokens": [256, 16],
           "saturation_streams": 64}  # fmt: skip


def _cell(target: str, rnd: int, level: int = 1, /, **figures: Any) -> dict[str, Any]:
    """A paced cell: every figure 1.0 unless given."""
    cell: dict[str, Any] = dict.fromkeys(ABSOLUTE, 1.0)
    cell.update((source, 1.0) for _, source in ADDED)
    cell.update(target=target, round=rnd, concurrency=level, scrape=None, chunks_match=True,
                failed=0)  # fmt: skip
    return {**cell, **figures}


def _sat(target: str, rnd: int, **long: Any) -> dict[str, Any]:
    """A saturation cell: the long run's figures (``long``) and the short one's."""
    figures = {"chunks": 100, "requests": 4, "failed": 0, "chunks_per_s": 1000.0,
               "target_cpu_util": 0.5, "cpu_us_per_chunk": 50.0, "cpu_system_share": 0.25,
               "cpu_user_us_per_chunk": 37.5, "chunks_per_cpu_s": 2000.0}  # fmt: skip
    return {"round": rnd, "target": target, "streams": 64, "tokens_256": {**figures, **long},
            "tokens_16": {**figures, "failed": 1}, "fit_cpu_us_per_chunk": 40.0,
            "fit_cpu_us_per_request": 300.0, "open_streams": 2000 + rnd,
            "rss_per_open_stream_kib": 12.0}  # fmt: skip


def _result(cells: list[dict[str, Any]], saturation: Sequence[dict[str, Any]] = ()) -> BenchResult:
    return BenchResult(MACHINE, OPTIONS, "no pinning", {"litellm": "not installed"},
                       cells, list(saturation))  # fmt: skip


def _row(summary: dict[str, Any], target: str, level: int = 1) -> dict[str, Any]:
    rows: list[dict[str, Any]] = summary["paced"]
    (row,) = (r for r in rows if (r["target"], r["concurrency"]) == (target, level))
    return row


def test_added_figures_are_taken_round_by_round_then_the_median() -> None:
    """Direct 1, 2, 3 ms and llmobs 1.5, 2.25, 5 ms: added 0.5, 0.25 and 2, whose median is
    0.5; the medians' difference (0.25) would hide the round the target cost most."""
    cells = [_cell("direct", r, delay_p50_ms=d) for r, d in enumerate((1.0, 2.0, 3.0))]
    cells += [_cell("llmobs", r, delay_p50_ms=d) for r, d in enumerate((1.5, 2.25, 5.0))]
    cells.append(_cell("llmobs", 3, delay_p50_ms=99.0))  # a round direct did not run: no added
    summary = summarize(_result(cells))
    llmobs = _row(summary, "llmobs")
    assert (llmobs["rounds"], llmobs["added_delay_p50_ms"]) == (4, 0.5)
    assert llmobs["delay_p50_ms"] == 3.625  # every round's absolute figure
    assert llmobs["delay_p50_vs_direct"] == 3.625 / 2.0
    assert _row(summary, "direct")["added_delay_p50_ms"] == 0.0
    assert math.isnan(llmobs["cpu_us_per_chunk_vs_nginx"])  # nginx did not run


def test_what_was_not_measured_is_skipped_not_counted() -> None:
    cells = [_cell(target, r, cpu_us_per_chunk=cpu)
             for target, r, cpu in (("direct", 0, None), ("llmobs", 0, None), ("llmobs", 1, 10.0),
                                    ("llmobs", 2, 20.0))]  # fmt: skip
    summary = summarize(_result(cells))
    assert math.isnan(_row(summary, "direct")["cpu_us_per_chunk"])
    assert _row(summary, "llmobs")["cpu_us_per_chunk"] == 15.0
    assert math.isnan(_row(summary, "llmobs")["scrape_gap_added_during_p99_ms"])  # no scrape


def test_scrapes_failures_and_mismatches_over_the_rounds() -> None:
    scrape = {"during_p99": 4.0, "during_max": 9.0, "outside_p99": 1.0, "outside_max": 2.0}
    cells = [_cell("direct", 0), _cell("llmobs", 0, scrape=scrape, failed=2),
             _cell("llmobs", 1, scrape={**scrape, "during_p99": 6.0}, failed=1,
                   chunks_match=False)]  # fmt: skip
    llmobs = _row(summarize(_result(cells)), "llmobs")
    assert (llmobs["scrape_gap_added_during_p99_ms"], llmobs["scrape_gap_added_during_max_ms"]) == (
        5.0, 9.0)  # fmt: skip
    assert (llmobs["failed"], llmobs["chunks_match"]) == (3, False)
    assert _row(summarize(_result(cells)), "direct")["chunks_match"] is True


def test_ratios_to_nginx_only_at_the_levels_it_ran() -> None:
    runs = (("nginx", 1, 20.0), ("llmobs", 1, 30.0), ("llmobs", 16, 40.0))
    cells = [_cell(target, 0, level, cpu_us_per_chunk=cpu) for target, level, cpu in runs]
    summary = summarize(_result(cells))
    assert _row(summary, "llmobs", 1)["cpu_us_per_chunk_vs_nginx"] == 1.5
    assert _row(summary, "nginx", 1)["cpu_us_per_chunk_vs_nginx"] == 1.0
    assert math.isnan(_row(summary, "llmobs", 16)["cpu_us_per_chunk_vs_nginx"])
    assert math.isnan(_row(summary, "llmobs", 1)["added_delay_p50_ms"])  # no direct at all


def test_saturation_is_read_from_the_long_run() -> None:
    saturation = [_sat("nginx", 0, cpu_us_per_chunk=20.0), _sat("llmobs", 0, cpu_us_per_chunk=30.0),
                  _sat("llmobs", 1, cpu_us_per_chunk=50.0, cpu_system_share=None)]  # fmt: skip
    rows = {r["target"]: r for r in summarize(_result([], saturation))["saturation"]}
    llmobs = rows["llmobs"]
    assert (llmobs["rounds"], llmobs["concurrency"], llmobs["cpu_us_per_chunk"]) == (2, 64, 40.0)
    assert llmobs["cpu_system_share"] == 0.25  # the round that measured it
    assert (llmobs["open_streams"], llmobs["failed"]) == (2001, 2)  # most held; every run's
    assert llmobs["cpu_us_per_chunk_vs_nginx"] == 2.0
    assert (rows["nginx"]["fit_cpu_us_per_chunk"], rows["nginx"]["chunks_per_s"]) == (40.0, 1000.0)


def test_the_table_says_what_ran_and_what_was_not_measured() -> None:
    cells = [_cell("llmobs", 0, 16, chunks_match=False), _cell("llmobs", 0, 1),
             _cell("direct", 0, 16, cpu_us_per_chunk=None), _cell("direct", 0, 1)]  # fmt: skip
    result = _result(cells)
    lines = table(result, summarize(result)).splitlines()
    assert lines[0] == (
        "llmobs bench: 2 CPUs (Test CPU), Linux 6.1, Python 3.11.7; no pinning; 3 rounds, "
        "median over rounds; + = added to direct (same round)"
    )
    assert lines[1] == "skipped litellm: not installed"
    rows = [line.split() for line in lines if line.split()[1:2] in (["1"], ["16"])]
    assert [(r[0], r[1]) for r in rows] == [
        ("direct", "1"),
        ("llmobs", "1"),
        ("direct", "16"),
        ("llmobs", "16"),
    ]  # by level, then --targets' order
    assert rows[2][10] == "-"  # direct's CPU per chunk: not measured
    assert (rows[1][-1], rows[3][-1]) == ("yes", "NO")  # chunks out = chunks in?
    assert not any(line.startswith("saturation") for line in lines)
    with_saturation = _result(cells, [_sat("llmobs", 0)])
    text = table(with_saturation, summarize(with_saturation))
    assert (
        "\nsaturation (64 streams, unpaced engine, 256 tokens; fit from 256 and 16 tokens)\n"
        in text
    )


def test_json_has_no_nan_and_every_figure() -> None:
    result = _result([_cell("direct", 0, cpu_us_per_chunk=None), _cell("llmobs", 0)])
    result.options = {**OPTIONS, "workdir": Path("/tmp/bench"), "concurrency": (1, 16)}
    summary = summarize(result)

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    data = json.loads(to_json(result, summary), parse_constant=refuse)
    assert data["machine"] == MACHINE and data["skipped"] == {"litellm": "not installed"}
    assert (data["options"]["workdir"], data["options"]["concurrency"]) == ("/tmp/bench", [1, 16])
    assert [c["target"] for c in data["cells"]] == ["direct", "llmobs"]
    direct = next(r for r in data["summary"]["paced"] if r["target"] == "direct")
    assert direct["cpu_us_per_chunk"] is None and direct["cpu_us_per_chunk_vs_nginx"] is None
    assert data["summary"]["saturation"] == []


def test_the_png_or_why_there_is_none(tmp_path: Path) -> None:
    cells = [_cell("direct", 0, 1), _cell("llmobs", 0, 1), _cell("direct", 0, 16),
             _cell("llmobs", 0, 16, cpu_us_per_chunk=None)]  # fmt: skip
    png = tmp_path / "bench.png"
    why = plot(summarize(_result(cells)), png)
    if importlib.util.find_spec("matplotlib") is None:
        assert why == "matplotlib not installed (pip install 'llmobs[bench]'): no PNG written"
        assert not png.exists()
    else:
        assert why is None
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize("name", [name for name, _ in ADDED])
def test_every_added_figure_is_the_difference_of_its_cells(name: str) -> None:
    source = dict(ADDED)[name]
    cells = [_cell("direct", 0, **{source: 2.0}), _cell("llmobs", 0, **{source: 2.75})]
    assert _row(summarize(_result(cells)), "llmobs")[name] == 0.75
