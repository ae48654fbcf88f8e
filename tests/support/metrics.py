"""Requests replayed into a sink with literal timestamps, and the golden /metrics text they make
(tests/fixtures/metrics.golden.txt)."""

from __future__ import annotations

from google.protobuf import text_format
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from llmobs.config.objectives import Objectives, ObjectiveSet
from llmobs.export.metrics.exposition import Format, Registry
from llmobs.export.telemetry import Telemetry, build_telemetry
from llmobs.observe.dialects import OLLAMA_GENERATE, OPENAI_CHAT, Route
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.record import TraceRef
from llmobs.observe.recorder import Recorder
from llmobs.observe.timing import Outcome, StreamTimer
from tests.support import FIXTURES, ROOT
from tests.support.exposition import read_delimited, rendered
from tests.support.recording import record_request, recording
from tests.support.scripted import chat_chunk, sse

GOLDEN = FIXTURES / "metrics.golden.txt"
DOCS = ROOT / "docs" / "metrics.md"
MS = 1_000_000


def recorder_and_telemetry(
    max_models: int = 32, tracing: bool = False, latest: bool = False
) -> tuple[Recorder, Telemetry]:
    """The recorder of a sink on the telemetry's registry; ``latest``: the newest GenAI
    conventions' names (OTEL_SEMCONV_STABILITY_OPT_IN)."""
    telemetry = build_telemetry(
        span_exporter=InMemorySpanExporter() if tracing else None, self_metrics=False
    )
    # latency bounds, so that their gauges and each request's latency ratio are observed
    bounded = Objectives(ObjectiveSet(ttft=1.0, tpot=0.05))
    _, recorder = recording(telemetry.registry, max_models, latest=latest, objectives=bounded)
    return recorder, telemetry


def replay(recorder: Recorder, model: str, gaps_ms: list[float], start_ms: float = 150) -> None:
    """One streaming chat request with a first token at ``start_ms`` and then ``gaps_ms``."""
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
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


def feed(recorder: Recorder, route: Route, body: bytes, ctype: str, chunks: list[bytes]) -> None:
    """One request of ``route`` whose response is ``chunks``, 20 ms apart."""
    obs = Observer(recorder, ObserveSettings(), route, 0)
    obs.request_body(body)
    obs.forwarded(0)
    obs.response(200, ctype)
    t = 100 * MS
    for chunk in chunks:
        obs.chunk(t, chunk)
        t += 20 * MS
    obs.finish(t, Outcome.OK)


def exposition(latest: bool = False) -> str:
    sink, telemetry = recorder_and_telemetry(tracing=True, latest=latest)
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


# --- one traced sink, in all three exposition formats (tests/fixtures/exposition/) ---

EXPOSITIONS = FIXTURES / "exposition"
CLOCK = 1_764_115_200.25  # when every exemplar was seen: a fixed time, so the files are fixed


def traced_sink() -> tuple[Recorder, Registry]:
    """A sink (its recorder) after a few requests of two models and two operations, all but
    one traced, with TTFTs and ITLs spread over several classic and native buckets, and one
    stall."""
    registry = Registry()
    _, recorder = recording(registry, 32, clock=lambda: CLOCK)
    plan = [
        ("chat", "llama", 120, [20, 21, 22, 20, 150, 21, 20], True),
        ("chat", "llama", 480, [30, 31, 29, 30], True),
        ("chat", "qwen", 2500, [9, 9, 10, 9, 9, 11], True),
        ("text_completion", "llama", 75, [45, 45, 46], False),
    ]
    for n, (op, model, ttft_ms, gaps_ms, traced) in enumerate(plan):
        timer = StreamTimer(0)
        t_ns = ttft_ms * MS
        timer.output(t_ns, 1)
        for gap in gaps_ms:
            t_ns += gap * MS
            timer.output(t_ns, 1)
        window = timer.take_window(None)
        record = timer.finish(
            t_ns + MS, operation=op, model=model, outcome=Outcome.OK, status=200,
            stream=True, input_tokens=12, output_tokens=len(gaps_ms) + 1,
        )  # fmt: skip
        trace = TraceRef(f"{n + 1:032x}", f"{n + 1:016x}") if traced else None
        record_request(recorder, record, [window], trace)
    return recorder, registry


def three_formats(registry: CollectorRegistry) -> dict[str, str]:
    """The registry as /metrics serves it in each format (protobuf as protobuf's text format,
    family after family, which is what a reader can compare)."""

    formats = (Format.TEXT, Format.OPENMETRICS, Format.PROTOBUF)
    text, openmetrics, proto = (rendered(registry, fmt) for fmt in formats)
    families = read_delimited(proto)
    readable = "".join(f"{text_format.MessageToString(f)}---\n" for f in families)
    return {"metrics.txt": text.decode(), "metrics.om.txt": openmetrics.decode(),
            "metrics.pb.txt": readable}  # fmt: skip
