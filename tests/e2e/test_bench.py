"""``llmobs bench``: its arithmetic on literal numbers, the sim's stamps, and a short real run.

The run starts real processes (the sim, ``llmobs serve``) on loopback for about ten seconds:
every figure the JSON promises must be there for every cell, chunks out must equal chunks in,
and the figures must be of the right sign and finite. Whether the goals are met is the
bench's business (docs/benchmarks.md), not a test's: this machine's timing is not asserted.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from llmobs.bench import BenchOptions, procfs, run_bench
from llmobs.bench.figures import (
    cpu_split,
    in_windows,
    latency,
    pct,
    per_stream_kib,
    per_unit_us,
    ratio,
    scrape_effect,
    ttft_path_ns,
)
from llmobs.bench.report import plot, summarize, table, to_json
from llmobs.bench.stamped_load import (
    LoadSpec,
    Stream,
    one_request,
    parse_events,
    request_body,
    run_load,
    session_for,
)
from llmobs.bench.targets import plan_pinning
from tests.support.servers import SimFactory

MS = 1_000_000


def stream(send: int, received: int, sent: list[int], arrivals: list[int]) -> Stream:
    s = Stream(send, status=200, received_ns=received, chunks=len(sent), done=True)
    s.sent.extend(sent)
    s.arrivals.extend(arrivals)
    return s


def test_percentiles_and_ratios() -> None:
    assert pct([1, 2, 3, 4, 5], 50) == 3.0
    assert pct([0, 10], 99) == pytest.approx(9.9)
    assert math.isnan(pct([], 50))
    assert ratio(3.0, 2.0) == 1.5
    assert math.isnan(ratio(1.0, 0.0))
    assert per_unit_us(0.5, 1000) == 500.0
    assert math.isnan(per_unit_us(1.0, 0))
    assert per_stream_kib(3 * 1024 * 100 + 1024 * 100, 1024 * 100, 100) == 3.0


def test_latency_of_literal_streams() -> None:
    # engine sends every 10 ms; the client sees each chunk 1 ms later, the third 3 ms later
    s = stream(0, 2 * MS, [10 * MS, 20 * MS, 30 * MS], [11 * MS, 21 * MS, 33 * MS])
    lat = latency([s])
    assert (lat.requests, lat.ok, lat.chunks) == (1, 1, 3)
    assert lat.ttft_p50 == 11.0  # send (0) to the first arrival
    assert lat.ttft_path_p50 == 3.0  # 2 ms in, 1 ms out; the engine's 8 ms wait left out
    assert lat.delay_p50 == 1.0
    assert lat.delay_max == 3.0
    assert lat.gap_p50 == 11.0  # gaps 10 and 12
    assert lat.jitter == pytest.approx(1.0)
    assert lat.gap_added_jitter == pytest.approx(1.0)  # gap added: 0 then 2
    assert list(ttft_path_ns([s])) == [3 * MS]


def test_latency_without_chunks_is_nan() -> None:
    lat = latency([Stream(0, status=500)])
    assert (lat.requests, lat.ok, lat.chunks) == (1, 0, 0)
    assert math.isnan(lat.delay_p50) and math.isnan(lat.jitter) and math.isnan(lat.ttft_p50)


def test_windows_and_scrape_effect() -> None:
    windows = [(100, 200), (500, 600)]
    starts = np.array([0, 150, 250, 550, 650, 90], dtype=np.int64)
    ends = np.array([99, 160, 400, 700, 700, 100], dtype=np.int64)
    assert list(in_windows(starts, ends, windows)) == [False, True, False, True, False, True]
    assert not in_windows(starts, ends, []).any()
    # chunk 2 crossed the scrape at 25-30 ms and came 4 ms late; chunk 3 was back on time
    s = stream(0, 0, [10 * MS, 20 * MS, 30 * MS, 40 * MS], [11 * MS, 21 * MS, 35 * MS, 41 * MS])
    effect = scrape_effect([s], [(25 * MS, 30 * MS)])
    assert effect.scrapes == 1
    assert effect.chunks_during == 1
    assert effect.during_max == 4.0
    assert effect.outside_max == 0.0  # chunk 1 (+0) and chunk 3 (-4)


def test_cpu_split_separates_chunk_and_request_costs() -> None:
    # 20 us per chunk, 300 us per request: 1000 requests of 256 chunks, then of 16
    runs = [(1000 * (256 * 20e-6 + 300e-6), 256_000, 1000), (1000 * (16 * 20e-6 + 300e-6),
            16_000, 1000)]  # fmt: skip
    per_chunk, per_request = cpu_split(runs)
    assert per_chunk == pytest.approx(20.0)
    assert per_request == pytest.approx(300.0)
    assert all(math.isnan(v) for v in cpu_split(runs[:1]))
    assert all(math.isnan(v) for v in cpu_split([runs[0], runs[0]]))  # collinear


@pytest.mark.skipif(not procfs.available(), reason="needs Linux /proc")
def test_the_kernels_share_of_cpu_tells_system_calls_from_computing() -> None:
    """``cpu_times``/``system_share`` on this process: a loop of arithmetic is user time,
    a loop of large reads from /dev/zero (the kernel fills the buffer) is system time."""
    pids = [os.getpid()]

    def share_of(work: Callable[[], object]) -> float:
        before = procfs.cpu_times(pids)
        deadline = time.process_time() + 0.3
        while time.process_time() < deadline:
            work()
        return procfs.system_share(before, procfs.cpu_times(pids))

    assert share_of(lambda: sum(range(10_000))) < 0.3
    with open("/dev/zero", "rb", buffering=0) as zero:
        assert share_of(lambda: zero.read(1 << 20)) > 0.7
    assert math.isnan(procfs.system_share((1.0, 2.0), (1.0, 2.0)))


def test_parse_events_reads_stamps_with_bytes_find() -> None:
    s = Stream(0)
    block = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":" a llmobs_received_ns=5 llmobs_sent_ns=7"}}]}'
        b'\n\ndata: {"choices":[{"delta":{"content":" b llmobs_sent_ns=9"}}]}'
    )
    parse_events(block, s, 100, record=True)
    assert (s.received_ns, s.chunks, list(s.sent), list(s.arrivals)) == (5, 2, [7, 9], [100] * 2)
    counted = Stream(0)
    parse_events(block, counted, 100, record=False)
    assert (counted.chunks, len(counted.sent)) == (2, 0)


def test_plan_pinning() -> None:
    assert plan_pinning([0, 1]).describe() == "engine cpu 0, client cpu 0, target cpu 1"
    three = plan_pinning([0, 1, 2, 3])
    assert (three.engine, three.client, three.target) == (
        frozenset({0}),
        frozenset({1}),
        frozenset({2}),
    )
    assert plan_pinning([0]).target is None
    assert plan_pinning([0, 1], enabled=False).engine is None


async def test_sim_stamps_every_token_event(start_sim: SimFactory) -> None:
    sim = await start_sim(stamp=True, prefill_base=0.0, prefill_per_token=0.0,
                          decode_base=0.002, decode_per_seq=0.0)  # fmt: skip
    spec = LoadSpec(sim.url, 1, 0.0, 6)
    async with session_for(1) as session:
        s = await one_request(session, sim.url + "/v1/chat/completions", request_body(spec),
                              {"Content-Type": "application/json"}, True)  # fmt: skip
        async with session.post(sim.url + "/v1/chat/completions", data=request_body(spec),
                                headers={"Content-Type": "application/json"}) as r:  # fmt: skip
            text = await r.text()
    assert s.ok and s.chunks == 6
    assert s.send_ns < s.received_ns < s.sent[0]  # one clock across client and engine
    assert list(s.sent) == sorted(s.sent)
    assert all(a >= t for a, t in zip(s.arrivals, s.sent, strict=True))
    # the stamp is in the token text, whose JSON stays valid; role and [DONE] carry none
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    contents = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert contents[0] == ""
    assert "llmobs_received_ns=" in contents[1] and "llmobs_sent_ns=" in contents[1]
    assert all("llmobs_sent_ns=" in c and "received" not in c for c in contents[2:])


async def test_sim_without_stamp_is_unchanged(start_sim: SimFactory) -> None:
    sim = await start_sim(decode_base=0.001)
    async with aiohttp.ClientSession() as session, session.post(
        sim.url + "/v1/chat/completions", data=request_body(LoadSpec(sim.url, 1, 0.0, 3)),
        headers={"Content-Type": "application/json"},
    ) as r:  # fmt: skip
        text = await r.text()
    assert "llmobs_" not in text


async def test_closed_loop_counts_every_chunk(start_sim: SimFactory) -> None:
    sim = await start_sim(stamp=True, prefill_base=0.0, prefill_per_token=0.0,
                          decode_base=0.002, decode_per_seq=0.0)  # fmt: skip
    result = await run_load(LoadSpec(sim.url, 3, 0.2, 5))
    assert result.streams and all(s.ok for s in result.streams)
    assert result.chunks == 5 * len(result.streams) == sim.engine.counters.generation_tokens


async def test_the_collector_never_runs_during_a_cell(start_sim: SimFactory) -> None:
    """A collection in the load generator stalls its loop: every chunk in flight would arrive
    late, charged to the target. None runs while a cell's load does; it is back after."""
    sim = await start_sim(stamp=True, prefill_base=0.0, prefill_per_token=0.0,
                          decode_base=0.002, decode_per_seq=0.0)  # fmt: skip
    collections: list[int] = []  # when each started

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(time.monotonic_ns())

    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        result = await run_load(LoadSpec(sim.url, 3, 0.2, 5))
    finally:
        gc.callbacks.remove(seen)
    assert result.streams and all(s.ok for s in result.streams)
    during = [t for t in collections if result.started_ns <= t <= result.ended_ns]
    assert during == []  # (aiohttp and the engine allocate enough for several otherwise)
    assert gc.isenabled()


CELL_FIELDS = (
    "round", "target", "concurrency", "tpot_ms", "wall_s", "requests", "ok", "chunks",
    "ttft_p50_ms", "ttft_p99_ms", "ttft_path_p50_ms", "ttft_path_p99_ms", "delay_p50_ms",
    "delay_p99_ms", "delay_max_ms", "gap_p50_ms", "jitter_ms", "gap_added_jitter_ms",
    "failed", "dropped", "engine_chunks", "chunks_match", "chunks_per_s", "cpu_s",
    "cpu_us_per_chunk", "cpu_us_per_request", "cpu_system_share", "cpu_user_us_per_chunk",
    "rss_idle_mib", "rss_per_active_stream_kib", "scrape",
)  # fmt: skip
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
    for row in data["summary"]["paced"]:
        assert set(SUMMARY_FIELDS) <= set(row)
        if row["target"] == "llmobs":
            for name in ("added_delay_p50_ms", "added_delay_p99_ms", "added_ttft_p50_ms"):
                assert -2.0 < row[name] < 1000, name  # a relay cannot make chunks faster
    sat = {s["target"]: s for s in data["saturation"]}
    assert sat["llmobs"]["tokens_30"]["chunks"] > 0 and sat["llmobs"]["open_streams"] == 20
    assert sat["llmobs"]["rss_per_open_stream_kib"] is not None
    assert sat["llmobs"]["fit_cpu_us_per_chunk"] is not None
    text = table(result, summary)
    assert "llmobs" in text and "saturation" in text
    why = plot(summary, tmp_path / "bench.png")
    assert why is not None or (tmp_path / "bench.png").stat().st_size > 0
