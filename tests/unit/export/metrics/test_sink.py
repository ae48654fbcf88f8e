"""The sink: the golden /metrics text, bounded model labels, the ITL histogram binned the same
whichever way a window comes."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import given
from prometheus_client import CollectorRegistry

from llmobs.config.objectives import Objective, Objectives, ObjectiveSet
from llmobs.export.metrics.catalogue import (
    ITL,
    ITL_SQUARES,
)
from llmobs.export.metrics.series import TokenHistogram
from llmobs.observe.dialects import OPENAI_CHAT
from llmobs.observe.labels import OTHER, BoundedLabel
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.slo import GOOD, Verdict
from llmobs.observe.stats import SMALL
from llmobs.observe.timing import Outcome, RequestStats, StreamTimer, TokenSource
from llmobs.observe.window import TokenWindow
from tests.support.metrics import (
    GOLDEN,
    MS,
    exposition,
    recorder_and_telemetry,
    replay,
    sample,
)
from tests.support.recording import record_request, recording
from tests.support.strategies import FAST, token_streams


def test_golden_exposition() -> None:
    text = exposition()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_model_label_is_bounded() -> None:
    recorder, telemetry = recorder_and_telemetry(max_models=3)
    for i in range(50):
        replay(recorder, f"model-{i}", [20.0, 20.0])
    models = {
        s.labels["gen_ai_request_model"]
        for fam in telemetry.registry.collect()
        for s in fam.samples
        if "gen_ai_request_model" in s.labels
    }
    # and unknown: its series (and other's) exist from the start, at 0
    assert models == {"model-0", "model-1", "model-2", "other", "unknown"}


def test_the_closed_label_sets_are_there_before_any_request_and_a_model_at_its_answer() -> None:
    """A first burst of errors must be an increase a scrape sees: the label sets of models
    not admitted (other) or not named (unknown) exist at 0 from the start, for each
    operation; a model's own from the engine's first answer (its 2xx head), before it ends."""
    registry = CollectorRegistry()
    _, recorder = recording(registry, 4)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    for op in ("chat", "text_completion", "other"):
        for model in ("other", "unknown"):
            labels = {"gen_ai_operation_name": op, "gen_ai_request_model": model}
            assert value("llmobs_slo_requests_total", **labels, verdict="bad") == 0
            assert value("llmobs_slo_misses_total", **labels, objective="error", cause="none") == 0
    llama = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "llama"}
    assert value("llmobs_slo_requests_total", **llama, verdict="bad") is None
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "llama"}')
    obs.response(200, "application/json")  # the engine's answer: admitted, its series at 0
    assert value("llmobs_slo_requests_total", **llama, verdict="bad") == 0
    assert recorder.admission.models.get("llama", admit=False) == "llama"


def test_a_model_name_that_is_not_unicode_is_other() -> None:
    """A lone surrogate (``"\\ud800"`` in JSON: the stdlib's parser, used without orjson,
    accepts it) would fail every later rendering of /metrics if it became a label."""
    models = BoundedLabel(3)
    assert models.get("m\ud800") == OTHER
    assert models.get("fine") == "fine"
    assert len(models) == 1  # the bad name took no slot


def test_models_of_failed_requests_do_not_take_label_slots() -> None:
    recorder, telemetry = recorder_and_telemetry(max_models=2)
    for i in range(10):  # a client probing unknown models: the engine answers 404
        obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
        obs.request_body(b'{"model": "probe-%d"}' % i)
        obs.response(404, "application/json")
        obs.finish(MS, Outcome.OK)
    replay(recorder, "real", [20.0, 20.0])
    assert sample(telemetry, "llmobs_requests_total", gen_ai_request_model="other") == 10
    assert sample(telemetry, "llmobs_requests_total", gen_ai_request_model="real") == 1


def reference_counts(histogram: TokenHistogram, window: TokenWindow) -> list[float]:
    """What binning a window means: numpy's searchsorted and weighted bincount."""
    bounds = np.asarray(histogram.histogram.bounds)
    index = np.searchsorted(bounds, window.itl, side="left")
    counts: list[float] = np.bincount(index, window.weights, bounds.size + 1).tolist()
    return counts


@FAST
@given(token_streams())
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


def _record(
    ttft: float, outcome: Outcome = Outcome.OK, status: int = 200, model: str = "llama"
) -> RequestStats:
    return RequestStats(
        "chat", model, outcome, status, True, 1.0, ttft, 0.01, 5, 10, TokenSource.USAGE, 10,
        9.0, 0.09, 0.001, 0.02, 0, 1.0,
    )  # fmt: skip


def test_the_sink_counts_each_verdict_and_starts_every_series_at_zero() -> None:
    registry = CollectorRegistry()
    qwen_set = ObjectiveSet(ttft=0.2, no_stalls=True, target=0.9)
    objectives = Objectives(ObjectiveSet(ttft=0.5), {(None, "qwen", None): qwen_set})
    _, recorder = recording(registry, 8, objectives=objectives)
    verdicts = [
        record_request(recorder, _record(0.1)),
        record_request(recorder, _record(0.9)),
        record_request(recorder, _record(0.1, Outcome.UPSTREAM_ERROR, 502)),
        record_request(recorder, _record(0.1, Outcome.CLIENT_DISCONNECT)),
        record_request(recorder, _record(0.3, model="qwen")),
    ]
    assert verdicts == [
        GOOD, Verdict(False, (Objective.TTFT,), ("none",)),
        Verdict(False, (Objective.ERROR,), ("none",)), None,
        Verdict(False, (Objective.TTFT,), ("none",)),
    ]  # fmt: skip

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    llama = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "llama"}
    qwen = {**llama, "gen_ai_request_model": "qwen"}
    assert value("llmobs_slo_requests_total", **llama, verdict="good") == 1
    assert value("llmobs_slo_requests_total", **llama, verdict="bad") == 2
    assert value("llmobs_slo_misses_total", **llama, objective="ttft", cause="none") == 1
    assert value("llmobs_slo_misses_total", **llama, objective="ttft", cause="queue") == 0
    assert value("llmobs_slo_misses_total", **llama, objective="error", cause="none") == 1
    assert value("llmobs_slo_output_tokens_total", **llama, verdict="good") == 10
    assert value("llmobs_slo_output_tokens_total", **llama, verdict="bad") == 20
    # qwen's own set: its target, and each of its objectives' series from 0
    assert value("llmobs_slo_target", **qwen) == 0.9
    assert value("llmobs_slo_target", **llama) == 0.999
    assert value("llmobs_slo_window_seconds", **qwen) == 28 * 86400
    assert value("llmobs_slo_requests_total", **qwen, verdict="good") == 0
    for cause in ("prefill", "preemption", "engine_pause", "client", "unknown"):
        assert value("llmobs_slo_misses_total", **qwen, objective="stall", cause=cause) == 0
    assert value("llmobs_slo_misses_total", **llama, objective="stall", cause="unknown") is None


def test_a_new_label_set_starts_its_series_at_zero() -> None:
    """A model seen once, without a stall, has ``llmobs_stalls_total`` at 0 (``rate()``
    over a healthy model reads 0, not "no data"), and its SLO series too."""
    recorder, telemetry = recorder_and_telemetry()
    replay(recorder, "steady", [20.0] * 5)
    try:
        assert sample(telemetry, "llmobs_stalls_total", gen_ai_request_model="steady") == 0
        names = {
            s.name
            for fam in telemetry.registry.collect()
            for s in fam.samples
            if s.labels.get("gen_ai_request_model") == "steady"
        }
        assert {"llmobs_stalls_total", "llmobs_slo_requests_total"} <= names
    finally:
        telemetry.shutdown()
