"""The observer (``observer.Observer``): errors counted and never raised, usage counted per chunk
or at the end as the engine reports it, an error inside a 200 stream an upstream error."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from llmobs.config.objectives import Objective, Objectives, ObjectiveSet
from llmobs.export.metrics.catalogue import (
    ITL,
    ITL_SQUARES,
)
from llmobs.export.metrics.series import TokenHistogram
from llmobs.export.metrics.sink import MetricsSink
from llmobs.export.telemetry import Telemetry, build_telemetry
from llmobs.observe.dialects import (
    ANTHROPIC,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    RESPONSES,
    TGI,
    TGI_STREAM,
    Route,
)
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.record import RequestRecord
from llmobs.observe.recorder import Recorder
from llmobs.observe.slo import Verdict
from llmobs.observe.timing import Outcome
from llmobs.observe.window import TokenWindow
from tests.support.metrics import (
    MS,
    recorder_and_telemetry,
    sample,
)
from tests.support.recording import recording
from tests.support.scripted import chat_chunk, sse


class BrokenHistogram(TokenHistogram):
    """An ITL histogram that cannot record a window."""

    def record(self, labels: tuple[str, ...], window: TokenWindow) -> None:
        raise RuntimeError("boom")


class BrokenSink(MetricsSink):
    """A sink whose token recording fails: observation must absorb it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self._itl = BrokenHistogram(ITL, ITL_SQUARES)


class Labels:
    """A consumer that keeps each record's model label."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def consume(self, record: RequestRecord) -> None:
        self.seen.append(record.label)


def test_an_observer_error_is_counted_and_never_raised() -> None:
    telemetry = build_telemetry()
    labels = Labels()
    recorder = Recorder(BrokenSink(telemetry.registry), consumers=[labels])
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
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
    # consumers after the sink (MBU/MFU, OTLP)
    assert sample(telemetry, "llmobs_requests_total", outcome="ok") == 1
    assert labels.seen == ["unknown"]


def observe(chunks: list[bytes], gap_ms: float = 20.0, status: int = 200) -> Telemetry:
    """Feed one chat stream, one chunk per ``gap_ms``; return its telemetry."""
    recorder, telemetry = recorder_and_telemetry()
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(0)
    obs.response(status, "text/event-stream")
    t = 100.0
    for chunk in chunks:
        obs.chunk(round(t * MS), chunk)
        t += gap_ms
    obs.finish(round(t * MS), Outcome.OK)
    return telemetry


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


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (OPENAI_CHAT, b'{"error":{"message":"bad","type":"invalid_request_error"}}'),
        (OPENAI_COMPLETIONS, b'{"error":{"message":"bad","type":"invalid_request_error"}}'),
        (RESPONSES, b'{"error":{"message":"bad","type":"invalid_request_error"}}'),
        (ANTHROPIC, b'{"type":"error","error":{"type":"invalid_request_error","message":"x"}}'),
        (TGI, b'{"error":"Input validation error","error_type":"validation"}'),
        (TGI_STREAM, b'{"error":"Input validation error","error_type":"validation"}'),
        (OLLAMA_CHAT, b'{"error":"model \\"nope\\" not found, try pulling it first"}'),
        (OLLAMA_GENERATE, b'{"error":"model \\"nope\\" not found, try pulling it first"}'),
        (OPENAI_CHAT, b"Bad Request"),  # not even JSON
    ],
)
def test_a_4xx_finishes_with_error_on_every_api(route: Route, body: bytes) -> None:
    """One rule for the finish-reason label of a refused request, whatever the API (Ollama's
    said ``error``, the others ``none``)."""
    recorder, telemetry = recorder_and_telemetry()
    obs = Observer(recorder, ObserveSettings(), route, 0)
    obs.request_body(b'{"model": "m", "stream": true, "inputs": "x", "prompt": "x"}')
    obs.forwarded(0)
    obs.response(400, "application/json")
    obs.chunk(10 * MS, body)
    obs.finish(20 * MS, Outcome.OK)
    try:
        assert sample(telemetry, "llmobs_requests_total", finish_reason="error") == 1
        assert sample(telemetry, "llmobs_requests_total", finish_reason="none") == 0
    finally:
        telemetry.shutdown()


def test_a_good_stream_keeps_its_own_finish_reason() -> None:
    last = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    telemetry = observe([*sse(chat_chunk(" a")), last, b"data: [DONE]\n\n"])
    assert sample(telemetry, "llmobs_requests_total", finish_reason="length") == 1


class Kept:
    """A consumer that keeps every record it is given."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def consume(self, record: RequestRecord) -> None:
        self.records.append(record)


class Broken:
    """A consumer that cannot take a record."""

    def consume(self, record: RequestRecord) -> None:
        raise RuntimeError("boom")


def test_every_consumer_gets_one_record_judged_once_and_a_broken_one_is_counted() -> None:
    """After the sink, each consumer the app assembles gets the same record (statistics, last
    windows, the verdict against the observer's objectives); one that raises is counted as
    an observation error, and the ones after it still get the record."""
    telemetry = build_telemetry()
    first, last = Kept(), Kept()
    objectives = Objectives(ObjectiveSet(ttft=0.001))  # 1 ms: this request misses it
    _, recorder = recording(
        telemetry.registry, objectives=objectives, consumers=(first, Broken(), last)
    )
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
    obs.response(200, "text/event-stream")
    for i, word in enumerate((" a", " b", " c"), start=1):
        obs.chunk(i * 5 * MS, sse(chat_chunk(word))[0])
    stats = obs.finish(20 * MS, Outcome.OK)
    assert stats is not None
    assert first.records == last.records and len(first.records) == 1
    record = first.records[0]
    assert record.stats == stats
    # missed under the phase that took most of it: the engine reported none, so other
    assert record.verdict == Verdict(False, (Objective.TTFT,), ("other",))
    assert sum(w.size for w in record.windows) == 2  # two gaps after the first token
    assert record.trace is None
    assert sample(telemetry, "llmobs_observer_errors_total") == 1
    assert sample(telemetry, "llmobs_requests_total", outcome="ok") == 1
