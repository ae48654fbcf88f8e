"""The live page's read of the sink's series (``export.ui.totals``): each model's totals,
every operation and tenant together, against what was recorded: TTFT and ITL counts per
bucket, TTFT seconds per phase, stalls by cause, output tokens, requests, the SLO's good and
bad requests and good tokens, the cost; a row for every model a counter has (the closed
values' too, at 0), and the queue and active requests now."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from llmobs.config.objectives import Objectives, ObjectiveSet
from llmobs.config.prices import Price, Prices
from llmobs.config.tenants import Tenancy
from llmobs.export.live import CAUSES, PHASES, ModelTotals
from llmobs.export.metrics.catalogue import ITL, TENANT_METRICS, TTFT
from llmobs.export.metrics.sink import MetricsSink
from llmobs.export.ui.totals import live_totals
from llmobs.observe.causes import Stall, StallCause
from llmobs.observe.labels import OTHER, UNKNOWN
from llmobs.observe.phases import TtftPhases
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.odd_series import window
from tests.support.recording import record_request, recording

MS = 1_000_000
# a euro per million tokens in, two out: a request's cost is (input + 2 x output) / 1e6
PRICES = Prices("EUR", {"*": Price(input=1.0, output=2.0, cached_input=1.0, reasoning=2.0)})


def stats(
    operation: str, model: str, ttft: float | None, output: int, input_tokens: int,
    *, outcome: Outcome = Outcome.OK, status: int = 200, stalls: int = 0,
) -> RequestStats:  # fmt: skip
    gaps = max(output - 1, 0)
    return RequestStats(
        operation, model, outcome, status, True, 1.0, ttft, 0.02 if gaps else None,
        input_tokens, output, TokenSource.USAGE, output, gaps, 0.02 * gaps, 0.0004 * gaps,
        0.02 if gaps else 0.0, stalls, 1.0,
    )  # fmt: skip


def buckets(size: int, counts: dict[int, float]) -> list[float]:
    """``size`` buckets' counts, those in ``counts`` by index, the rest 0."""
    return [counts.get(i, 0.0) for i in range(size)]


def zero(ttft: int = len(TTFT.buckets) + 1, itl: int = len(ITL.buckets) + 1) -> ModelTotals:
    """A model's row with nothing counted yet (its series at 0 from the start)."""
    return ModelTotals(
        [0.0] * ttft, [0.0] * itl, causes=[0.0] * len(CAUSES), phases=[0.0] * len(PHASES),
        cost=0.0,
    )  # fmt: skip


def traffic() -> MetricsSink:
    """Two models' requests, judged against a TTFT of 1 s, priced; three requests active and
    one queued now."""
    sink, recorder = recording(
        CollectorRegistry(), objectives=Objectives(ObjectiveSet(ttft=1.0)), prices=PRICES
    )
    # llama: a good chat with a window of ITLs, a slow completion (bad), a chat the client
    # left (not judged)
    record_request(recorder, stats("chat", "llama", 0.12, 10, 100), [window([0.018, 0.28], [8, 1])])
    record_request(recorder, stats("text_completion", "llama", 2.5, 5, 50))
    left = stats("chat", "llama", 0.03, 3, 10, outcome=Outcome.CLIENT_DISCONNECT)
    record_request(recorder, left)
    # qwen: a good chat with three stalls (two judged: the client's, a prefill's) and its TTFT
    # in phases, then one the engine failed (bad, no tokens out)
    causes = (Stall(0, 200 * MS, StallCause.CLIENT), Stall(300 * MS, 500 * MS, StallCause.PREFILL))
    phases = TtftPhases(50 * MS, None, None, None, 300 * MS)
    chat = stats("chat", "qwen", 0.35, 30, 20, stalls=3)
    record_request(recorder, chat, phases=phases, stalls=causes)
    failed = stats("chat", "qwen", None, 0, 0, outcome=Outcome.UPSTREAM_ERROR, status=502)
    record_request(recorder, failed)
    for _ in range(3):
        sink.request_started()
    sink.queue_enter()
    sink.queue_enter()
    sink.queue_leave()
    return sink


def test_each_model_s_totals_are_what_was_recorded() -> None:
    models, queue, active = live_totals(traffic())
    ttft, itl = len(TTFT.buckets) + 1, len(ITL.buckets) + 1
    llama = ModelTotals(
        # TTFT 0.03 s in (0.025, 0.05], 0.12 in (0.1, 0.15], 2.5 in (2, 3]; ITL 0.018 s eight
        # times in (0.015, 0.02], 0.28 once in (0.25, 0.3]
        ttft=buckets(ttft, {2: 1, 5: 1, 14: 1}), itl=buckets(itl, {10: 8, 23: 1}),
        stalls=0, tokens=18, requests=3, good=1, bad=1, good_tokens=10,
        causes=[0.0] * len(CAUSES), phases=[0.0] * len(PHASES),
    )  # fmt: skip
    qwen = ModelTotals(
        ttft=buckets(ttft, {8: 1}), itl=[0.0] * itl,  # 0.35 s in (0.3, 0.4]
        stalls=3, tokens=30, requests=2, good=1, bad=1, good_tokens=30,
        causes=[1, 0, 0, 1, 1],  # prefill, client, and the third unjudged: unknown
        phases=[0.05, 0, 0, 0, 0.3, 0, 0, 0],  # before the engine, other
    )  # fmt: skip
    assert CAUSES == ("prefill", "preemption", "engine_pause", "client", "unknown")
    assert PHASES == (
        "before_engine",
        "load",
        "queue",
        "prefill",
        "other",
        "remote_prefill",
        "kv_transfer",
        "first_decode",
    )
    assert set(models) == {"llama", "qwen", OTHER, UNKNOWN}  # the closed values' from the start
    # the cost apart: a float summed in another order
    costs = {"llama": (100 + 2 * 10 + 50 + 2 * 5 + 10 + 2 * 3) / 1e6, "qwen": (20 + 2 * 30) / 1e6}
    for model, expected in (("llama", llama), ("qwen", qwen)):
        assert dataclasses.replace(models[model], cost=None) == expected
        assert models[model].cost == pytest.approx(costs[model])
    assert models[OTHER] == models[UNKNOWN] == zero()
    assert (queue, active) == (1, 3)


def test_without_a_price_file_there_is_no_cost() -> None:
    sink, recorder = recording(CollectorRegistry())
    record_request(recorder, stats("chat", "llama", 0.12, 10, 100))
    models, queue, active = live_totals(sink)
    assert {model: totals.cost for model, totals in models.items()} == dict.fromkeys(
        (OTHER, UNKNOWN, "llama"), None
    )
    assert (models["llama"].requests, models["llama"].tokens, queue, active) == (1, 10, 0, 0)
    # no objectives but the default set's: the request is judged all the same
    assert (models["llama"].good, models["llama"].bad) == (1, 0)


def test_a_model_s_tenants_add_up() -> None:
    """With every family labelled by tenant, a model's row is its tenants' sum."""
    tenancy = Tenancy("x-tenant", metrics=tuple(TENANT_METRICS))
    sink, recorder = recording(CollectorRegistry(), tenancy=tenancy, prices=PRICES)
    for tenant, ttft, output in (("acme", 0.12, 10), ("umbrella", 0.12, 4), ("acme", 0.35, 2)):
        record_request(recorder, stats("chat", "llama", ttft, output, 10), tenant=tenant)
    llama = live_totals(sink)[0]["llama"]
    assert llama.ttft == buckets(len(TTFT.buckets) + 1, {5: 2, 8: 1})
    assert (llama.requests, llama.tokens, llama.good, llama.good_tokens) == (3, 16, 3, 16)
    assert llama.cost == pytest.approx((3 * 10 + 2 * 16) / 1e6)
