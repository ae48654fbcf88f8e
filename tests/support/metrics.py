"""Requests replayed into a sink with literal timestamps, and the golden /metrics text they make
(tests/fixtures/metrics.golden.txt)."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from llmobs.formats import OLLAMA_GENERATE, OPENAI_CHAT, Route
from llmobs.metrics.sink import MetricsSink
from llmobs.observer import ObserveConfig, Observer
from llmobs.telemetry import Telemetry, build_telemetry
from llmobs.timing import Outcome
from tests.support import FIXTURES, ROOT
from tests.support.scripted import chat_chunk, sse

GOLDEN = FIXTURES / "metrics.golden.txt"
DOCS = ROOT / "docs" / "metrics.md"
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


def sample(telemetry: Telemetry, name: str, **labels: str) -> float:
    return sum(
        s.value
        for fam in telemetry.registry.collect()
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
