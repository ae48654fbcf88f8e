"""The live page's ring (``llmobs.export.live``): one point a second from the sidecar's totals, what
changed since the second before; bounded in time and in models."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import pytest

from llmobs.export.live import ALL, GLOBAL, MODEL_SLOTS, LiveRing, ModelTotals, Totals
from llmobs.export.metrics.catalogue import ITL, TTFT

TTFT_BOUNDS, ITL_BOUNDS = TTFT.buckets, ITL.buckets


def counts(bounds: tuple[float, ...], values: list[float]) -> list[float]:
    """Per-bucket counts (``+Inf`` last) of ``values``, as the sink keeps them."""
    out = [0.0] * (len(bounds) + 1)
    for v in values:
        out[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += 1
    return out


def totals(ttfts: list[float], gaps: list[float], **extra: Any) -> ModelTotals:
    return ModelTotals(counts(TTFT_BOUNDS, ttfts), counts(ITL_BOUNDS, gaps), **extra)


def test_a_point_is_what_changed_in_its_second() -> None:
    ring = LiveRing(TTFT_BOUNDS, ITL_BOUNDS, seconds=60)
    ring.add(100.0, Totals({"m": totals([], [])}))
    gaps = [0.02] * 40 + [0.07] * 3 + [0.15] * 2 + [0.5]  # a stall of 500 ms among them
    now = totals([0.3] * 4, gaps, stalls=1, tokens=50, requests=4, good=3, bad=1, good_tokens=30)
    # why: the stall was the client's; the four TTFTs were 0.8 s of queue, 0.4 s of the rest
    now = dataclasses.replace(now, causes=[0, 0, 0, 1, 0], phases=[0.1, 0, 0.8, 0, 0.3])
    ring.add(101.0, Totals({"m": now}, queue=3, active=5, gauges={"engine_waiting": 2}))
    data = ring.data()
    assert data["t"] == [100.0, 101.0]
    m = data["models"]["m"]
    assert m["itl_le_50ms"] == [0, 40] and m["itl_50_100ms"] == [0, 3]
    assert m["itl_100_250ms"] == [0, 2] and m["itl_gt_250ms"] == [0, 1]
    assert (m["stalls"], m["tokens"], m["requests"]) == ([0, 1], [0, 50], [0, 4])
    assert m["stalls_client"] == [0, 1] and m["stalls_prefill"] == [0, 0]
    # the mean request's TTFT by phase: 0.2 s of queue each, 0.075 of other, 0.025 before
    assert m["ttft_queue"] == [None, 0.2] and m["ttft_other"] == [None, 0.075]
    assert m["ttft_before_engine"] == [None, 0.025] and m["ttft_load"] == [None, 0]
    assert m["attainment"] == [None, 0.75] and m["goodput"] == [0, 30]
    # four requests of 0.3 s TTFT: every quantile in the (0.2, 0.3] bucket
    assert m["ttft_p50"][0] is None and 0.2 < m["ttft_p50"][1] <= 0.3
    assert data["global"]["queue"] == [0, 3] and data["global"]["active"] == [0, 5]
    assert data["global"]["engine_waiting"] == [None, 2]
    assert data["global"]["gpu_memory_used"] == [None, None]  # no GPU collector: no value
    assert data["models"][ALL] == m  # one model: "all" is that model
    # the same totals a second later: nothing happened in that second
    ring.add(102.0, Totals({"m": now}))
    m = ring.data(since=101.0)["models"]["m"]
    assert (m["tokens"], m["stalls"], m["itl_le_50ms"]) == ([0], [0], [0])
    assert 0.2 < m["ttft_p99"][0] <= 0.3  # TTFT quantiles: over the last 10 s
    assert m["ttft_queue"] == [0.2] and m["stalls_client"] == [0]  # phases: so too


def test_ttft_quantiles_forget_requests_older_than_their_window() -> None:
    ring = LiveRing(TTFT_BOUNDS, ITL_BOUNDS)
    slow = totals([5.0], [])
    ring.add(0.0, Totals({"m": ModelTotals()}))
    ring.add(1.0, Totals({"m": slow}))
    for t in range(2, 12):  # ten seconds with no request: the slow one leaves the window
        ring.add(float(t), Totals({"m": slow}))
    p99 = ring.data()["models"]["m"]["ttft_p99"]
    assert p99[1] is not None and p99[1] > 4
    assert p99[-1] is None


def test_models_and_time_are_bounded() -> None:
    ring = LiveRing(TTFT_BOUNDS, ITL_BOUNDS, seconds=30)
    for t in range(100):
        models = {f"model-{i}": totals([], [], tokens=t * i) for i in range(20)}
        ring.add(float(t), Totals(models))
    data = ring.data()
    assert len(data["t"]) == 30 and data["t"][0] == 70.0
    assert list(data["models"]) == [ALL, *(f"model-{i}" for i in range(MODEL_SLOTS - 1))]
    # "all" holds every model, those without a slot too: 0 + 1 + ... + 19 tokens a second
    assert data["models"][ALL]["tokens"][-1] == sum(range(20))
    point = ring.points[-1]
    assert len(point) == len(GLOBAL) + MODEL_SLOTS * len(data["models"][ALL])
    assert point.itemsize * len(point) <= 1928


def test_a_counter_that_goes_back_reads_zero_not_negative() -> None:
    ring = LiveRing(TTFT_BOUNDS, ITL_BOUNDS)
    ring.add(0.0, Totals({"m": totals([], [0.01] * 5, tokens=10)}))
    ring.add(1.0, Totals({"m": totals([], [], tokens=4)}))
    m = ring.data()["models"]["m"]
    assert m["tokens"][-1] == 0 and m["itl_le_50ms"][-1] == 0


def test_data_has_no_nan_and_since_filters() -> None:
    ring = LiveRing(TTFT_BOUNDS, ITL_BOUNDS)
    for t in range(5):
        ring.add(float(t), Totals({}))
    data = ring.data(since=2.0)
    assert data["t"] == [3.0, 4.0]
    values = [v for cols in data["models"].values() for col in cols.values() for v in col]
    values += [v for col in data["global"].values() for v in col]
    assert all(v is None or math.isfinite(v) for v in values)
    assert ring.data(since=10.0)["t"] == []


def test_the_data_names_the_currency_its_costs_are_in() -> None:
    """The page's cost chart says what its numbers are (issue 53: a cost axis with no unit)."""
    ring = LiveRing(TTFT_BOUNDS, ITL_BOUNDS, currency="EUR")
    ring.add(1.0, Totals({"m": totals([], [], cost=0.0)}))
    ring.add(2.0, Totals({"m": totals([], [], cost=9e-05)}))
    data = ring.data()
    assert data["currency"] == "EUR" and data["models"]["m"]["cost"] == [0.0, 9e-05]
    assert LiveRing(TTFT_BOUNDS, ITL_BOUNDS).data()["currency"] == ""  # no price file


@pytest.mark.parametrize("seconds", [10, 600])
def test_memory_is_what_the_docs_say(seconds: int) -> None:
    ring = LiveRing(TTFT_BOUNDS, ITL_BOUNDS, seconds=seconds)
    for t in range(seconds + 5):
        ring.add(float(t), Totals({f"m{i}": totals([0.1], [0.02]) for i in range(8)}))
    assert len(ring.points) == seconds
    # 241 numbers a second, 1,928 bytes, ~2 KB with the array's own header (live's docstring)
    assert all(len(p) * p.itemsize == 1928 for p in ring.points)
    assert sum(sys.getsizeof(p) for p in ring.points) <= seconds * 2010
