"""The bench's arithmetic (``bench.figures``) on literal streams: percentiles, latency, the
delay a relay adds, a scrape's effect, CPU per chunk and per request."""

from __future__ import annotations

import math

import numpy as np
import pytest

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
from llmobs.bench.stamped_load import Stream

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
