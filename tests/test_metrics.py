"""The catalogue, the exposition format (golden file) and observer robustness."""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client import generate_latest

from llmobs.metrics import CATALOGUE, Kind, MetricsSink, status_class
from llmobs.observer import ObserveConfig, Observer
from llmobs.telemetry import Telemetry, build_telemetry
from llmobs.timing import Outcome
from tests.scripted import chat_chunk, sse

GOLDEN = Path(__file__).parent / "fixtures" / "metrics.golden.txt"
DOCS = Path(__file__).parent.parent / "docs" / "metrics.md"
MS = 1_000_000


def sink_and_telemetry(max_models: int = 32) -> tuple[MetricsSink, Telemetry]:
    telemetry = build_telemetry()
    sink = MetricsSink(telemetry.meter, max_models)
    telemetry.registry.register(sink.tokens)
    return sink, telemetry


def replay(sink: MetricsSink, model: str, gaps_ms: list[float], start_ms: float = 150) -> None:
    """One streaming chat request with a first token at ``start_ms`` and then ``gaps_ms``."""
    obs = Observer(sink, ObserveConfig(), "chat", 0)
    obs.request_body(b'{"model": "%s", "stream": true}' % model.encode())
    obs.forwarded()
    obs.response(200, "text/event-stream; charset=utf-8")
    t = start_ms
    obs.chunk(round(t * MS), b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
    obs.chunk(round(t * MS), sse(chat_chunk(" a"))[0])
    for gap in gaps_ms:
        t += gap
        obs.chunk(round(t * MS), sse(chat_chunk(" b"))[0])
    usage = b'{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d}}' % (
        len(gaps_ms) + 1
    )
    obs.chunk(round(t * MS), b"data: " + usage + b"\n\ndata: [DONE]\n\n")
    obs.finish(round((t + 1) * MS), Outcome.OK)


def exposition() -> str:
    sink, telemetry = sink_and_telemetry()
    replay(sink, "llama", [20.0] * 9)
    replay(sink, "llama", [20.0] * 4 + [120.0] + [20.0] * 4)
    return generate_latest(telemetry.registry).decode()


def test_golden_exposition() -> None:
    text = exposition()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_every_catalogue_metric_is_exposed_with_its_labels() -> None:
    text = exposition()
    for metric in CATALOGUE:
        suffix = "_bucket" if metric.kind in (Kind.HISTOGRAM, Kind.TOKEN_HISTOGRAM) else ""
        pattern = "^" + re.escape(metric.prometheus + suffix) + r"(\{[^}]*\})? "
        lines = [m.group(0) for m in re.finditer(pattern, text, re.MULTILINE)]
        assert lines, metric.prometheus
        if metric.kind is not Kind.UPDOWN and metric.labels:
            for label in metric.prometheus_labels:
                assert f'{label}="' in lines[0], (metric.prometheus, label)


def test_no_prometheus_name_is_defined_twice() -> None:
    names = [m.prometheus for m in CATALOGUE]
    assert len(names) == len(set(names))


def test_docs_list_every_metric() -> None:
    docs = DOCS.read_text()
    for metric in CATALOGUE:
        assert f"`{metric.prometheus}`" in docs, metric.prometheus


def test_model_label_is_bounded() -> None:
    sink, telemetry = sink_and_telemetry(max_models=3)
    for i in range(50):
        replay(sink, f"model-{i}", [20.0, 20.0])
    models = {
        s.labels["gen_ai_request_model"]
        for fam in telemetry.registry.collect()
        for s in fam.samples
        if "gen_ai_request_model" in s.labels
    }
    assert models == {"model-0", "model-1", "model-2", "other"}


class BrokenSink(MetricsSink):
    """A sink whose token recording fails: observation must absorb it."""

    def record_tokens(self, *args: object) -> None:
        raise RuntimeError("boom")


def test_an_observer_error_is_counted_and_never_raised() -> None:
    telemetry = build_telemetry()
    sink = BrokenSink(telemetry.meter, 8)
    obs = Observer(sink, ObserveConfig(), "chat", 0)
    obs.response(200, "text/event-stream")
    obs.chunk(1, sse(chat_chunk(" x"))[0])
    obs.finish(2, Outcome.OK)
    assert obs.finish(3, Outcome.UPSTREAM_ERROR) is None  # idempotent
    errors = [
        s.value
        for fam in telemetry.registry.collect()
        for s in fam.samples
        if s.name == "llmobs_observer_errors_total"
    ]
    assert errors == [1.0]


def test_status_class() -> None:
    assert [status_class(s) for s in (0, 200, 404, 502, 999)] == ["0xx", "2xx", "4xx", "5xx", "0xx"]
