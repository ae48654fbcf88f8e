"""The OTLP consumer: each request's record into OpenTelemetry instruments, the same numbers
as the Prometheus series under the same labels (read here with the SDK's in-memory reader)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from llmobs.config.objectives import Objectives, ObjectiveSet
from llmobs.config.prices import Price, Prices
from llmobs.config.tenants import Tenancy
from llmobs.export.metrics.catalogue import TPOT
from llmobs.export.metrics.otel import OtelMetrics
from llmobs.export.metrics.sink import MetricsSink
from llmobs.observe.dialects import OPENAI_CHAT
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.provider import Provider
from llmobs.observe.recorder import Recorder
from llmobs.observe.timing import Outcome
from tests.support.recording import recording
from tests.support.scripted import chat_chunk, sse


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Every data point by instrument name: (attributes, the point)."""
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    out.setdefault(metric.name, []).append((dict(point.attributes or {}), point))
    return out


def request(recorder: Recorder, model: str, status: int = 200) -> None:
    """One streaming chat request of three tokens, 20 ms apart, its first at 100 ms."""
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "%s", "stream": true}' % model.encode())
    obs.forwarded(0)
    obs.response(status, "text/event-stream")
    for i, chunk in enumerate(sse(chat_chunk("a"), chat_chunk("b"), chat_chunk("c"))):
        obs.chunk((100 + 20 * i) * 1_000_000, chunk)
    obs.finish(200_000_000, Outcome.OK)


def pushing(
    max_models: int = 4, provider: Provider | None = None, **options: Any
) -> tuple[MetricsSink, Recorder, InMemoryMetricReader]:
    """A sink and, after it, the OTLP consumer of the same mapping, as the app assembles
    them; ``options``: the recording's (``tests.support.recording``)."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    sink, recorder = recording(None, max_models, **options)
    otel = OtelMetrics(meter, sink.mapping, sink.live, provider)
    return sink, Recorder(sink, recorder.admission, recorder.objectives, recorder.prices,
                          [otel]), reader  # fmt: skip


@pytest.fixture
def pushed() -> tuple[MetricsSink, Recorder, InMemoryMetricReader]:
    objectives = Objectives(ObjectiveSet(ttft=0.05))
    return pushing(1, Provider("vllm"), objectives=objectives)


def test_a_request_is_pushed_as_it_is_counted(
    pushed: tuple[MetricsSink, Recorder, InMemoryMetricReader],
) -> None:
    _, recorder, reader = pushed
    request(recorder, "m")
    got = points(reader)
    ((attrs, ttft),) = got["gen_ai.server.time_to_first_token"]
    assert attrs == {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                     "gen_ai.provider.name": "vllm"}  # fmt: skip
    assert ttft.count == 1 and ttft.sum == pytest.approx(0.1)
    ((attrs, _),) = got["llmobs.smoothness"]  # llmobs's own families: no provider
    assert "gen_ai.provider.name" not in attrs
    usage = {a["gen_ai.token.type"]: p.sum for a, p in got["gen_ai.client.token.usage"]}
    assert usage == {"output": 3}
    ((attrs, requests),) = got["llmobs.requests"]
    assert attrs["outcome"] == "ok" and requests.value == 1
    # the verdict: TTFT 100 ms against 50 ms, so bad, and the objective it missed
    ((attrs, bad),) = got["llmobs.slo.requests"]
    assert (attrs["verdict"], bad.value) == ("bad", 1)
    ((attrs, missed),) = got["llmobs.slo.misses"]
    assert (attrs["objective"], missed.value) == ("ttft", 1)


def test_labels_are_the_records_so_the_cap_holds_on_both_paths(
    pushed: tuple[MetricsSink, Recorder, InMemoryMetricReader],
) -> None:
    """The label cap is 1: the first model keeps its name, the second is ``other``, in OTLP
    as on /metrics; a failed request admits no new model."""
    _, recorder, reader = pushed
    request(recorder, "first")
    request(recorder, "second")
    request(recorder, "third", status=404)
    models = sorted(
        (a["gen_ai.request.model"], p.count)
        for a, p in points(reader)["gen_ai.server.request.duration"]
    )
    assert models == [("first", 1), ("other", 2)]


def test_the_label_less_series_are_read_from_the_sink_at_each_export(
    pushed: tuple[MetricsSink, Recorder, InMemoryMetricReader],
) -> None:
    sink, _, reader = pushed
    sink.request_started()
    sink.queue_enter()
    sink.malformed(3)
    got = points(reader)
    live = {name: got[name][0][1].value for name in (
        "llmobs.requests.active", "llmobs.prefill.queue_depth", "llmobs.stream.malformed_events",
        "llmobs.observer.errors")}  # fmt: skip
    assert live == {"llmobs.requests.active": 1, "llmobs.prefill.queue_depth": 1,
                    "llmobs.stream.malformed_events": 3, "llmobs.observer.errors": 0}  # fmt: skip
    sink.queue_leave()
    assert points(reader)["llmobs.prefill.queue_depth"][0][1].value == 0


def test_a_tenants_families_and_cost_are_pushed_as_counted() -> None:
    """Tenants on requests and TTFT (not TPOT), and a price: OTLP carries the tenant where
    the series do, and the cost with its verdict and currency."""
    tenancy = Tenancy(header="x-tenant", metrics=("requests", "ttft", "cost"))
    prices = Prices("EUR", {"m": Price(1000.0, 2000.0, 1000.0, 2000.0)})
    _, recorder, reader = pushing(tenancy=tenancy, prices=prices)
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0, tenant="team-a")
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(0)
    obs.response(200, "text/event-stream")
    for i, chunk in enumerate(sse(chat_chunk("a"), chat_chunk("b"), chat_chunk("c"))):
        obs.chunk((100 + 20 * i) * 1_000_000, chunk)
    obs.finish(200_000_000, Outcome.OK)
    got = points(reader)
    ((ttft, _),) = got["gen_ai.server.time_to_first_token"]
    assert ttft["tenant"] == "team-a"
    ((tpot, _),) = got["gen_ai.server.time_per_output_token"]
    assert "tenant" not in tpot
    ((requests, _),) = got["llmobs.requests"]
    assert requests["tenant"] == "team-a"
    ((cost, value),) = got["llmobs.cost"]
    assert cost == {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                    "verdict": "good", "currency": "EUR", "tenant": "team-a"}  # fmt: skip
    assert value.value == pytest.approx(3 * 2000 / 1e6)  # three counted output tokens


def test_the_operators_buckets_are_pushed_too() -> None:
    _, recorder, reader = pushing(buckets=(("ttft", (0.1, 0.8, 2.0)),))
    request(recorder, "m")
    ((_, ttft),) = points(reader)["gen_ai.server.time_to_first_token"]
    assert list(ttft.explicit_bounds) == [0.1, 0.8, 2.0]
    ((_, tpot),) = points(reader)["gen_ai.server.time_per_output_token"]
    assert list(tpot.explicit_bounds) == list(TPOT.buckets)  # the catalogue's


def test_the_newest_conventions_split_token_usage_by_kind() -> None:
    """Opted in: a histogram per direction and a counter per kind (reasoning within output),
    with the provider and an unknown modality; no v1.41 token usage histogram."""
    _, recorder, reader = pushing(provider=Provider("sglang"), latest=True)
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "r1"}')
    obs.forwarded(0)
    obs.response(200, "application/json")
    obs.chunk(50_000_000, b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],'
              b'"usage":{"prompt_tokens":12,"completion_tokens":9,'
              b'"prompt_tokens_details":{"cached_tokens":8},'
              b'"completion_tokens_details":{"reasoning_tokens":5}}}')  # fmt: skip
    obs.finish(60_000_000, Outcome.OK)
    got = points(reader)
    assert "gen_ai.client.token.usage" not in got
    kinds = ("input_tokens", "output_tokens", "cache_read.input_tokens", "reasoning.output_tokens")
    counters = {
        name: [(a["gen_ai.token.modality"], a["gen_ai.provider.name"], p.value) for a, p in points]
        for name, points in got.items() if name.startswith("gen_ai.client.inference.usage.")
    }  # fmt: skip
    assert sorted(counters) == sorted(f"gen_ai.client.inference.usage.{k}" for k in kinds)
    assert counters == {
        "gen_ai.client.inference.usage.input_tokens": [("unknown", "sglang", 12)],
        "gen_ai.client.inference.usage.output_tokens": [("unknown", "sglang", 9)],
        "gen_ai.client.inference.usage.cache_read.input_tokens": [("unknown", "sglang", 8)],
        "gen_ai.client.inference.usage.reasoning.output_tokens": [("unknown", "sglang", 5)],
    }
    for direction, tokens in (("input", 12), ("output", 9)):
        ((attrs, hist),) = got[f"gen_ai.client.inference.operation.{direction}_tokens"]
        assert (hist.count, hist.sum, attrs["gen_ai.provider.name"]) == (1, tokens, "sglang")
        assert "gen_ai.token.modality" not in attrs
