"""The parsers' fuzz properties, in one place: each a function that asserts them of one input.

No exception escapes a decoder, a dialect, the request parser or ``--inject-usage``'s
rewriting and stripping; any chunking gives the same result; buffers and a dialect's state
stay bounded. ``tests/unit/observe/test_fuzz.py`` drives them with hypothesis (a few dozen
examples each in CI); ``benchmarks/fuzz.py`` runs that file with many more examples, and
feeds atheris' inputs to ``check_stream``, which holds one stream to every property.
"""

from __future__ import annotations

import json
from typing import Any

from llmobs.observe.dialects import (
    ANTHROPIC,
    OLLAMA_CHAT,
    OPENAI_CHAT,
    OTHER_ROUTE,
    RESPONSES,
    TGI_STREAM,
)
from llmobs.observe.dialects.anthropic import AnthropicStream
from llmobs.observe.dialects.base import (
    CAPTURE_LIMIT,
    FINISH_REASONS,
    MAX_FINISH_REASONS,
    Dialect,
    Passthrough,
    loads,
)
from llmobs.observe.dialects.ollama import OllamaStream
from llmobs.observe.dialects.openai import OpenAIStream
from llmobs.observe.dialects.request import parse_request
from llmobs.observe.dialects.responses import ResponsesStream
from llmobs.observe.dialects.tgi import TgiStream
from llmobs.observe.framing import NdjsonDecoder, SseDecoder
from llmobs.relay.inject import UsageStripper, inject_usage
from tests.support.strategies import split_at

DIALECTS: tuple[type[Dialect], ...] = (
    OpenAIStream, ResponsesStream, AnthropicStream, TgiStream, OllamaStream, Passthrough,
)  # fmt: skip
ROUTES = (OPENAI_CHAT, RESPONSES, ANTHROPIC, TGI_STREAM, OLLAMA_CHAT, OTHER_ROUTE)


# -- the decoders ---------------------------------------------------------------------------
def sse_run(chunks: list[bytes], max_line: int) -> tuple[list[Any], int, int]:
    """Events, malformed and comment counts of an SSE decoder fed ``chunks`` in turn."""
    decoder = SseDecoder(max_line)
    events: list[Any] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
        # a line and an event at most, whatever arrives
        assert decoder.buffered <= 2 * max_line, "SSE decoder buffer unbounded"
    events.extend(decoder.flush())
    return events, decoder.malformed, decoder.comments


def ndjson_run(chunks: list[bytes], max_line: int) -> tuple[list[bytes], int]:
    """Lines and malformed count of an NDJSON decoder fed ``chunks`` in turn."""
    decoder = NdjsonDecoder(max_line)
    lines: list[bytes] = []
    for chunk in chunks:
        lines.extend(decoder.feed(chunk))
        assert decoder.buffered <= max_line, "NDJSON decoder buffer unbounded"
    lines.extend(decoder.flush())
    return lines, decoder.malformed


def sse_same_events(data: bytes, chunks: list[bytes], max_line: int) -> None:
    assert sse_run(chunks, max_line) == sse_run([data], max_line), "SSE depends on the chunking"


def ndjson_same_lines(data: bytes, chunks: list[bytes], max_line: int) -> None:
    assert ndjson_run(chunks, max_line) == ndjson_run([data], max_line), (
        "NDJSON depends on the chunking"
    )


# -- the dialects ---------------------------------------------------------------------------
def fresh(kind: type[Dialect]) -> Dialect:
    dialect = kind()
    dialect.captured = []  # --capture-content: the keep() paths too
    return dialect


def check_state(dialect: Dialect) -> None:
    """What a dialect keeps is well-typed and bounded, whatever it was fed."""
    assert all(isinstance(k, int) and 0 <= k < 64 and v >= 0 for k, v in dialect.pending.items())
    assert set(dialect.finish_reasons) <= set(FINISH_REASONS)
    assert len(dialect.finish_reasons) <= MAX_FINISH_REASONS
    for count in (dialect.input_tokens, dialect.output_tokens, dialect.reasoning_tokens,
                  dialect.cached_tokens):  # fmt: skip
        assert count is None or (isinstance(count, int) and not isinstance(count, bool))
    captured = dialect.captured or []
    assert sum(map(len, captured[:-1])) < CAPTURE_LIMIT


def dialects_take_any_payloads(payloads: list[bytes]) -> None:
    """Every dialect's ``on_data`` counts any payload without raising."""
    for kind in DIALECTS:
        dialect = fresh(kind)
        for payload in payloads:
            tokens = dialect.on_data(payload)
            assert isinstance(tokens, int)
            assert tokens >= 0
        check_state(dialect)


def dialects_take_any_objects(objects: list[dict[str, Any]]) -> None:
    """Every dialect's ``on_object`` and ``on_body`` take any JSON object without raising."""
    for kind in DIALECTS:
        dialect = fresh(kind)
        for obj in objects:
            assert dialect.on_object(obj) >= 0
            dialect.pending.clear()
        for obj in objects:
            dialect.on_body(obj)
        check_state(dialect)


# -- the request: its parsing, --inject-usage -----------------------------------------------
def requests_parse(body: bytes) -> None:
    """Any request body parses on every route, and a rewritten one asks for usage."""
    for route in ROUTES:
        info = parse_request(body, route, capture=True)
        assert info.model is None or isinstance(info.model, str)
    rewritten = inject_usage(body)
    if rewritten is not None:
        assert json.loads(rewritten)["stream_options"]["include_usage"] is True


def strip_run(chunks: list[bytes], max_event: int) -> tuple[bytes, int]:
    """What a usage stripper fed ``chunks`` passes on, and how many events it stripped."""
    stripper = UsageStripper(max_event)
    out = b""
    for chunk in chunks:
        out += stripper.feed(chunk)
        # one short event held at most
        assert len(stripper._buffer) <= max_event, "usage stripper buffer unbounded"
    return out + stripper.flush(), stripper.stripped


def stripper_same_output(data: bytes, chunks: list[bytes], max_event: int) -> None:
    out, stripped = strip_run(chunks, max_event)
    if stripped == 0:
        assert out == data, "bytes changed with nothing stripped"  # verbatim, to the byte
    assert out == strip_run([data], max_event)[0], "usage stripping depends on the chunking"


# -- all of them, on one stream (atheris' input) --------------------------------------------
def check_stream(stream: bytes, cuts: list[int], limit: int) -> None:
    """Every property on one stream of bytes read in pieces cut at ``cuts``, with ``limit``
    as the decoders' line and the stripper's event limit: what it decodes to, and the stream
    itself, go to every dialect, and the stream is parsed as a request body too."""
    chunks = split_at(stream, cuts)
    sse_same_events(stream, chunks, limit)
    ndjson_same_lines(stream, chunks, limit)
    events = sse_run([stream], limit)[0]
    payloads = [e.data for e in events] + ndjson_run([stream], limit)[0] + [stream]
    dialects_take_any_payloads(payloads)
    objects: list[dict[str, Any]] = []
    for payload in payloads:
        try:
            obj = loads(payload)
        except ValueError:
            continue
        if isinstance(obj, dict):
            objects.append(obj)
    dialects_take_any_objects(objects)
    requests_parse(stream)
    stripper_same_output(stream, chunks, limit)
