"""The one mapping from a record to what it observes (``metrics.mapping``): the Prometheus
series and the OTLP instruments take every request's observations from it, so the two hold
the same numbers under the same labels, whatever the request (tenants, prices, stalls, TTFT
phases, misses, errors, either GenAI convention). Read here side by side: every series of the
sink against every data point the SDK's in-memory reader collects."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from llmobs.config.objectives import Objective, Objectives, ObjectiveSet
from llmobs.config.prices import Price, Prices
from llmobs.config.tenants import METRIC_NAMES, Tenancy
from llmobs.export.metrics.catalogue import (
    ACTIVE,
    ITL,
    ITL_SQUARES,
    MALFORMED,
    OBSERVER_ERRORS,
    QUEUE_DEPTH,
    SLO_BOUND,
    SLO_TARGET,
    SLO_WINDOW,
    MetricDef,
)
from llmobs.export.metrics.mapping import RequestMapping, exemplar_of
from llmobs.export.metrics.otel import OtelMetrics
from llmobs.export.metrics.series import CounterFamily, HistogramFamily
from llmobs.export.metrics.sink import MetricsSink
from llmobs.observe.dialects import OLLAMA_GENERATE, OPENAI_CHAT
from llmobs.observe.labels import LabelAdmission
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.provider import Provider
from llmobs.observe.record import RequestRecord, TraceRef
from llmobs.observe.recorder import Recorder
from llmobs.observe.slo import GOOD, Verdict
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from tests.support.metrics import MS, OLLAMA_LINES, REASONING_CHUNKS
from tests.support.scripted import chat_chunk, sse

_PUSHED_LIVE = (ACTIVE, QUEUE_DEPTH, OBSERVER_ERRORS, MALFORMED)  # read from the sink instead
Points = dict[str, dict[frozenset[tuple[str, Any]], Any]]


def _assembled(latest: bool) -> tuple[MetricsSink, Recorder, InMemoryMetricReader]:
    """A sink and an OTLP consumer of one mapping, as the app assembles them: tenants on
    every family that can carry them, a price file, an objective a slow request misses."""
    tenancy = Tenancy(header="x-tenant", metrics=METRIC_NAMES)
    objectives = Objectives(ObjectiveSet(ttft=0.2, no_stalls=True))
    prices = Prices("EUR", {"m": Price(1000.0, 2000.0, 500.0, 3000.0)})
    mapping = RequestMapping(objectives, tenancy, prices.currency, (), latest)
    sink = MetricsSink(None, mapping, provider="vllm")
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    otel = OtelMetrics(meter, mapping, sink.live, Provider("vllm"))
    admission = LabelAdmission(4, tenancy, 4)
    return sink, Recorder(sink, admission, objectives, prices, [otel]), reader


def _stream(recorder: Recorder, gaps_ms: list[float], tenant: str, status: int = 200) -> None:
    """A streaming chat request of model m: a first token at 150 ms, then ``gaps_ms``."""
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0, tenant=tenant)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(5 * MS)
    obs.response(status, "text/event-stream")
    t = 150.0
    for i, chunk in enumerate(sse(*[chat_chunk(" w")] * (len(gaps_ms) + 1))):
        t += gaps_ms[i - 1] if i else 0.0
        obs.chunk(round(t * MS), chunk)
    obs.finish(round((t + 1) * MS), Outcome.OK)


def _replayed(recorder: Recorder, route: Any, body: bytes, ctype: str, chunks: list[bytes]) -> None:
    obs = Observer(recorder, ObserveSettings(), route, 0, tenant="team-b")
    obs.request_body(body)
    obs.forwarded(0)
    obs.response(200, ctype)
    for i, chunk in enumerate(chunks):
        obs.chunk((100 + 20 * i) * MS, chunk)
    obs.finish((100 + 20 * len(chunks)) * MS, Outcome.OK)


def _traffic(recorder: Recorder) -> None:
    _stream(recorder, [20.0] * 8, "team-a")  # good
    _stream(recorder, [20.0] * 4 + [400.0] + [20.0] * 4, "team-a")  # a stall: bad
    _stream(recorder, [20.0] * 3, "team-b", status=500)  # an engine error
    _stream(recorder, [20.0], "team-c")  # one token: no gap, no ITL
    _replayed(recorder, OLLAMA_GENERATE, b'{"model":"m"}', "application/x-ndjson", OLLAMA_LINES)
    _replayed(recorder, OPENAI_CHAT, b'{"model":"r1","stream":true}', "text/event-stream",
              REASONING_CHUNKS)  # fmt: skip


def _pushed(reader: InMemoryMetricReader) -> Points:
    """Every OTLP data point by instrument name, then by its attribute set."""
    data = reader.get_metrics_data()
    assert data is not None
    out: Points = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = out.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    points[frozenset((point.attributes or {}).items())] = point
    return out


def _attributes(
    mapping: RequestMapping, metric: MetricDef, key: tuple[str, ...]
) -> frozenset[tuple[str, Any]]:
    return frozenset(zip(mapping.define(metric).labels, key, strict=True))


@pytest.mark.parametrize("latest", [False, True])
def test_the_series_and_the_pushed_points_are_the_same_numbers(latest: bool) -> None:
    sink, recorder, reader = _assembled(latest)
    _traffic(recorder)
    pushed = _pushed(reader)
    seen: set[tuple[str, frozenset[tuple[str, Any]]]] = set()
    for metric, family in sink.families.items():
        if metric in (ITL, ITL_SQUARES, *_PUSHED_LIVE):
            continue  # binned in bulk (Prometheus only); read from the sink at each export
        points = pushed.get(metric.name, {})
        for key, values in _series(family):
            attributes = _attributes(sink.mapping, metric, key)
            point = points.get(attributes)
            if point is None:  # a series at 0 from its label set's start: nothing to push;
                # an objective's settings are pushed at its label set's first request
                settings = (SLO_TARGET, SLO_WINDOW, SLO_BOUND)
                assert metric in settings or not any(values), (metric.name, key)
                continue
            seen.add((metric.name, attributes))
            if isinstance(family, HistogramFamily):
                assert list(point.bucket_counts) == values[: family.size], (metric.name, key)
                assert point.sum == pytest.approx(values[family.size]), (metric.name, key)
            else:
                assert point.value == pytest.approx(values[0]), (metric.name, key)
    every = {(name, attrs) for name, points in pushed.items() for attrs in points}
    live = {m.name for m in _PUSHED_LIVE}
    assert {(name, attrs) for name, attrs in every if name not in live} == seen
    # what the traffic was meant to reach, so that the comparison above covered it
    names = {name for name, _ in seen}
    assert {"llmobs.stalls", "llmobs.slo.misses", "llmobs.cost", "llmobs.ttft.phase.duration",
            "llmobs.engine.load.duration", "llmobs.slo.target"} <= names  # fmt: skip
    usage = (
        "gen_ai.client.inference.usage.reasoning.output_tokens"
        if latest
        else ("gen_ai.client.token.usage")
    )
    assert usage in names


def _series(family: HistogramFamily | CounterFamily) -> list[tuple[tuple[str, ...], list[Any]]]:
    if isinstance(family, HistogramFamily):
        return [(key, list(values)) for key, values in family.series.items()]
    return [(key, [value]) for key, value in family.series.items()]


def _stats(**changes: Any) -> RequestStats:
    stats = RequestStats(
        "chat", "m", Outcome.OK, 200, True, 1.0, 0.1, 0.01, 5, 10, TokenSource.USAGE, 10,
        9.0, 0.09, 0.001, 0.02, 0, 1.0,
    )  # fmt: skip
    return stats._replace(**changes)


def test_a_request_observes_each_family_once_under_its_labels() -> None:
    """The observations of one judged, priced, tenanted request, as the mapping names them."""
    tenancy = Tenancy(header="x-tenant", metrics=("requests", "slo"))
    mapping = RequestMapping(tenancy=tenancy, currency="USD")
    labels = mapping.label_set("chat", "m", "team-a", "vllm")
    bad = Verdict(False, (Objective.TTFT, Objective.STALL), ("queue", "prefill"))
    record = RequestRecord(
        _stats(stalls=2), (), bad, None, "m", tenant="team-a", cost=0.5, ratio=1.25
    )
    values, counts = mapping.observe(record, labels)
    assert values[:6] == (1.0, 0.1, 0.01, 1.0, None, None)  # duration .. engine load
    assert values[6] == 1.25  # its latency against its objective
    assert values[7:9] == (5, 10)  # input and output tokens
    assert values[9:] == ()  # no TTFT phases: none observed
    assert [(m.name, key, n) for m, key, n in counts] == [
        ("llmobs.requests", ("chat", "m", "team-a", "ok", "2xx", "none"), 1),
        ("llmobs.tokens", ("chat", "m", "input", "usage"), 5),
        ("llmobs.tokens", ("chat", "m", "output", "usage"), 10),
        ("llmobs.stalls", ("chat", "m", "unknown"), 2),  # none judged: their cause unknown
        ("llmobs.slo.requests", ("chat", "m", "team-a", "bad"), 1),
        ("llmobs.slo.output_tokens", ("chat", "m", "team-a", "bad"), 10),
        ("llmobs.slo.misses", ("chat", "m", "team-a", "ttft", "queue"), 1),
        ("llmobs.slo.misses", ("chat", "m", "team-a", "stall", "prefill"), 1),
        ("llmobs.cost", ("chat", "m", "bad", "USD"), 0.5),
    ]
    # each histogram's label values: the provider where the GenAI conventions require it
    assert labels.histograms[0][1] == ("chat", "m", "vllm")
    assert labels.histograms[3][1] == ("chat", "m")  # smoothness: llmobs's own


def test_an_unjudged_request_counts_in_no_slo_series_and_its_cost_under_none() -> None:
    mapping = RequestMapping(currency="EUR")
    labels = mapping.label_set("chat", "m", "", "unknown")
    record = RequestRecord(_stats(), (), None, None, "m", cost=0.25)
    _, counts = mapping.observe(record, labels)
    assert [m.name for m, _, _ in counts] == [
        "llmobs.requests", "llmobs.tokens", "llmobs.tokens", "llmobs.cost",
    ]  # fmt: skip
    assert counts[-1][1] == ("chat", "m", "none", "EUR")
    # no currency: no cost observed, whatever the record says
    _, counts = RequestMapping().observe(record, RequestMapping().label_set("chat", "m", "", "x"))
    assert "llmobs.cost" not in [m.name for m, _, _ in counts]


@pytest.mark.parametrize("latest", [False, True])
def test_token_counts_name_each_kind_once_in_order(latest: bool) -> None:
    """By type and source; opted in, the same counts by kind into the newest counters."""
    mapping = RequestMapping(latest=latest)
    labels = mapping.label_set("chat", "m", "", "vllm")
    stats = _stats(reasoning_tokens=3, cached_tokens=2, token_source=TokenSource.COUNTED)
    values, counts = mapping.observe(RequestRecord(stats, (), None, None, "m"), labels)
    tokens = [(key[2:], n) for m, key, n in counts if m.name == "llmobs.tokens"]
    assert tokens == [
        (("input", "usage"), 5), (("output", "counted"), 10), (("reasoning", "usage"), 3),
        (("cached_input", "usage"), 2),
    ]  # fmt: skip
    assert values[6:9] == (None, 5, 10)  # no latency ratio (no bound): tokens
    usage = [(m.name.rsplit(".usage.", 1)[1], key, n) for m, key, n in counts
             if m.name.startswith("gen_ai.client.inference.usage.")]  # fmt: skip
    assert usage == ([
        ("input_tokens", ("chat", "m", "vllm", "unknown"), 5),
        ("output_tokens", ("chat", "m", "vllm", "unknown"), 10),
        ("reasoning.output_tokens", ("chat", "m", "vllm", "unknown"), 3),
        ("cache_read.input_tokens", ("chat", "m", "vllm", "unknown"), 2),
    ] if latest else [])  # fmt: skip
    nothing = _stats(input_tokens=None, output_tokens=0, ttft_s=None)
    values, counts = mapping.observe(RequestRecord(nothing, (), None, None, "m"), labels)
    assert [m.name for m, _, _ in counts] == ["llmobs.requests"]
    assert values[7:9] == (None, None)
    # a request whose first token came but the engine's usage says none: 0 output counted
    zero = _stats(input_tokens=None, output_tokens=0)
    _, counts = mapping.observe(RequestRecord(zero, (), None, None, "m"), labels)
    assert [(key[2:], n) for m, key, n in counts if m.name == "llmobs.tokens"] == [
        (("output", "usage"), 0)
    ]


def test_an_exemplar_points_only_at_a_trace_that_is_kept() -> None:
    kept, sampled_out = TraceRef("a" * 32, "b" * 16), TraceRef("a" * 32, "b" * 16, False)
    bad = Verdict(False, (Objective.TTFT,), ("queue",))
    assert exemplar_of(RequestRecord(_stats(), (), GOOD, kept, "m")) is kept
    assert exemplar_of(RequestRecord(_stats(), (), GOOD, sampled_out, "m")) is None
    assert exemplar_of(RequestRecord(_stats(), (), None, sampled_out, "m")) is None
    assert exemplar_of(RequestRecord(_stats(), (), bad, sampled_out, "m")) is sampled_out
    assert exemplar_of(RequestRecord(_stats(), (), bad, None, "m")) is None


def test_the_closed_label_sets_cover_every_operation_and_tenant_value() -> None:
    assert len(RequestMapping().closed_label_sets()) == 3 * 2
    on = RequestMapping(tenancy=Tenancy(header="x-tenant"))
    assert len(on.closed_label_sets()) == 3 * 2 * 2
    assert ("other", "unknown", "other") in on.closed_label_sets()
