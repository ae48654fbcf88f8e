"""The catalogue, the exposition format (golden file) and observer robustness."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from llmobs.formats import OLLAMA_GENERATE, OPENAI_CHAT, Route
from llmobs.labels import OTHER, BoundedLabel
from llmobs.metrics.catalogue import (
    CATALOGUE,
    COLLECTOR_METRICS,
    ITL,
    ITL_SQUARES,
    Kind,
    status_class,
)
from llmobs.metrics.series import TokenHistogram
from llmobs.metrics.sink import MetricsSink
from llmobs.observer import ObserveConfig, Observer
from llmobs.stats import SMALL, TokenWindow
from llmobs.telemetry import Telemetry, build_telemetry
from llmobs.timing import Outcome, StreamStats, StreamTimer
from tests.scripted import chat_chunk, sse
from tests.test_fuzz import FAST
from tests.test_stats import streams

GOLDEN = Path(__file__).parent / "fixtures" / "metrics.golden.txt"
DOCS = Path(__file__).parent.parent / "docs" / "metrics.md"
MS = 1_000_000


def sink_and_telemetry(
    max_models: int = 32, tracing: bool = False
) -> tuple[MetricsSink, Telemetry]:
    telemetry = build_telemetry(span_exporter=InMemorySpanExporter() if tracing else None)
    sink = MetricsSink(telemetry.registry, max_models)
    return sink, telemetry


def replay(sink: MetricsSink, model: str, gaps_ms: list[float], start_ms: float = 150) -> None:
    """One streaming chat request with a first token at ``start_ms`` and then ``gaps_ms``."""
    obs = Observer(sink, ObserveConfig(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "%s", "stream": true}' % model.encode())
    obs.forwarded(0)
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


OLLAMA_LINES = [
    b'{"model":"qwen","response":" a","done":false}\n',
    b'{"model":"qwen","response":" b","done":false}\n{"model":"qwen","response":" c",',
    b'"done":false}\n',
    b'{"model":"qwen","response":"","done":true,"done_reason":"length","total_duration":900000000,'
    b'"load_duration":5000000,"prompt_eval_count":9,"prompt_eval_duration":120000000,'
    b'"eval_count":3,"eval_duration":40000000}\n',
]
REASONING_CHUNKS = [
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":" hmm"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" yes"},"finish_reason":"stop"}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":32}}}\n\n',
]


def feed(sink: MetricsSink, route: Route, body: bytes, ctype: str, chunks: list[bytes]) -> None:
    """One request of ``route`` whose response is ``chunks``, 20 ms apart."""
    obs = Observer(sink, ObserveConfig(), route, 0)
    obs.request_body(body)
    obs.forwarded(0)
    obs.response(200, ctype)
    t = 100 * MS
    for chunk in chunks:
        obs.chunk(t, chunk)
        t += 20 * MS
    obs.finish(t, Outcome.OK)


def exposition() -> str:
    sink, telemetry = sink_and_telemetry(tracing=True)
    replay(sink, "llama", [20.0] * 9)
    replay(sink, "llama", [20.0] * 4 + [120.0] + [20.0] * 4)
    feed(sink, OLLAMA_GENERATE, b'{"model":"qwen"}', "application/x-ndjson", OLLAMA_LINES)
    feed(sink, OPENAI_CHAT, b'{"model":"r1","stream":true}', "text/event-stream",
         REASONING_CHUNKS)  # fmt: skip
    text = generate_latest(telemetry.registry).decode()
    telemetry.shutdown()
    return text


def test_golden_exposition() -> None:
    text = exposition()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_every_catalogue_metric_is_exposed_with_its_labels() -> None:
    text = exposition()
    for metric in CATALOGUE:
        if metric in COLLECTOR_METRICS:  # background collectors: tests/test_collectors_e2e.py
            continue
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


def test_a_model_name_that_is_not_unicode_is_other() -> None:
    """A lone surrogate (``"\\ud800"`` in JSON: the stdlib's parser, used without orjson,
    accepts it) would fail every later rendering of /metrics if it became a label."""
    models = BoundedLabel(3)
    assert models.get("m\ud800") == OTHER
    assert models.get("fine") == "fine"
    assert len(models) == 1  # the bad name took no slot


class BrokenHistogram(TokenHistogram):
    """An ITL histogram that cannot record a window."""

    def record(self, labels: tuple[str, ...], window: TokenWindow) -> None:
        raise RuntimeError("boom")


class BrokenSink(MetricsSink):
    """A sink whose token recording fails: observation must absorb it."""

    def __init__(
        self,
        registry: CollectorRegistry,
        max_models: int,
        on_request: Callable[[str, StreamStats], None],
    ) -> None:
        super().__init__(registry, max_models, on_request)
        self._itl = BrokenHistogram(ITL, ITL_SQUARES)


def test_an_observer_error_is_counted_and_never_raised() -> None:
    telemetry = build_telemetry()
    hooked: list[str] = []
    sink = BrokenSink(telemetry.registry, 8, lambda model, s: hooked.append(model))
    obs = Observer(sink, ObserveConfig(), OPENAI_CHAT, 0)
    obs.response(200, "text/event-stream")
    obs.chunk(1, sse(chat_chunk(" x"))[0])
    obs.chunk(2, sse(chat_chunk(" y"))[0])
    obs.finish(3, Outcome.OK)
    assert obs.finish(4, Outcome.UPSTREAM_ERROR) is None  # idempotent
    errors = [
        s.value
        for fam in telemetry.registry.collect()
        for s in fam.samples
        if s.name == "llmobs_observer_errors_total"
    ]
    assert errors == [1.0]
    # the request is still counted, exactly once, with its outcome, and still reaches the
    # per-request hook (MBU/MFU)
    assert sample(telemetry, "llmobs_requests_total", outcome="ok") == 1
    assert len(hooked) == 1


def test_status_class() -> None:
    assert [status_class(s) for s in (0, 200, 404, 502, 999)] == ["0xx", "2xx", "4xx", "5xx", "0xx"]


def observe(chunks: list[bytes], gap_ms: float = 20.0, status: int = 200) -> Telemetry:
    """Feed one chat stream, one chunk per ``gap_ms``; return its telemetry."""
    sink, telemetry = sink_and_telemetry()
    obs = Observer(sink, ObserveConfig(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(0)
    obs.response(status, "text/event-stream")
    t = 100.0
    for chunk in chunks:
        obs.chunk(round(t * MS), chunk)
        t += gap_ms
    obs.finish(round(t * MS), Outcome.OK)
    return telemetry


def sample(telemetry: Telemetry, name: str, **labels: str) -> float:
    return sum(
        s.value
        for fam in telemetry.registry.collect()
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_final_usage_on_the_last_chunk_with_choices_is_not_per_chunk_usage() -> None:
    # llama.cpp / TGI style: the total rides on the last chunk, next to an empty delta
    last = (
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":20}}\n\n'
    )
    telemetry = observe([*sse(*[chat_chunk(" w")] * 20), last, b"data: [DONE]\n\n"])
    assert sample(telemetry, "llmobs_inter_token_latency_seconds_count") == 19
    assert sample(telemetry, "llmobs_smoothness_sum") == pytest.approx(1.0)
    assert sample(telemetry, "gen_ai_server_time_per_output_token_seconds_sum") == (
        pytest.approx(0.020)
    )


def test_continuous_usage_counts_tokens_per_chunk_exactly() -> None:
    chunks = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}],'
        b'"usage":{"completion_tokens":0}}\n\n',
        b'data: {"choices":[{"delta":{"content":" a"}}],"usage":{"completion_tokens":1}}\n\n',
        b'data: {"choices":[{"delta":{"content":" b c d"}}],"usage":{"completion_tokens":4}}\n\n',
        b'data: {"choices":[{"delta":{"content":" e f g"}}],"usage":{"completion_tokens":7}}\n\n',
    ]
    telemetry = observe(chunks)
    assert sample(telemetry, "llmobs_inter_token_latency_seconds_count") == 6
    assert sample(telemetry, "llmobs_inter_token_latency_seconds_sum") == pytest.approx(0.04)


def test_an_error_inside_a_200_stream_is_an_upstream_error() -> None:
    err = b'data: {"error":{"message":"engine died","type":"internal_error"}}\n\n'
    telemetry = observe([*sse(chat_chunk(" a")), err])
    assert sample(telemetry, "llmobs_requests_total", outcome="upstream_error") == 1


def test_models_of_failed_requests_do_not_take_label_slots() -> None:
    sink, telemetry = sink_and_telemetry(max_models=2)
    for i in range(10):  # a client probing unknown models: the engine answers 404
        obs = Observer(sink, ObserveConfig(), OPENAI_CHAT, 0)
        obs.request_body(b'{"model": "probe-%d"}' % i)
        obs.response(404, "application/json")
        obs.finish(MS, Outcome.OK)
    replay(sink, "real", [20.0, 20.0])
    assert sample(telemetry, "llmobs_requests_total", gen_ai_request_model="other") == 10
    assert sample(telemetry, "llmobs_requests_total", gen_ai_request_model="real") == 1


def reference_counts(histogram: TokenHistogram, window: TokenWindow) -> list[float]:
    """What binning a window means: numpy's searchsorted and weighted bincount."""
    bounds = np.asarray(histogram.histogram.bounds)
    index = np.searchsorted(bounds, window.itl, side="left")
    counts: list[float] = np.bincount(index, window.weights, bounds.size + 1).tolist()
    return counts


@FAST
@given(streams())
def test_token_histogram_bins_either_window_the_same(
    stream: tuple[list[tuple[int, int]], int | None, int],
) -> None:
    chunks, total, size = stream
    histograms = []
    for small in (SMALL, 0):  # lists binned in Python; arrays with numpy
        timer = StreamTimer(0, window=size, small=small)
        windows = []
        for t, tokens in chunks:
            if timer.output(t, tokens):
                windows.append(timer.take_window())
        windows.append(timer.take_window(total_tokens=total))
        histogram = TokenHistogram(ITL, ITL_SQUARES)
        expected = [0.0] * (len(histogram.histogram.bounds) + 1)
        for window in windows:
            histogram.record(("chat", "m"), window)
            for i, count in enumerate(reference_counts(histogram, window)):
                expected[i] += count
        series = histogram.histogram.series.get(("chat", "m"))
        if series is not None:
            assert series[:-1] == expected
            assert all(type(v) is float or v == 0 for v in series[:-1])
        histograms.append((series, histogram.squares.series))
    a, b = histograms
    assert repr(a) == repr(b)
