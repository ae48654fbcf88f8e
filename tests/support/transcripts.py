"""Transcripts read by the pure decoder and dialect: what each dialect's test module checks
against the transcripts of its format (tests/fixtures/streams/), and what the live replay
through the sidecar compares its first output chunk with.

A transcript's expected token events are ``[choice, tokens, kind]`` lists, ``kind`` being
``text`` or ``reasoning``; any split of its bytes into reads must give the same events and
the same end state, as the dialect would meet them from a real engine.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmobs.observe.dialects import detect_stream, route_for_path
from llmobs.observe.dialects.base import Dialect, loads
from llmobs.observe.framing import Framing, NdjsonDecoder, SseDecoder
from tests.support import FIXTURES
from tests.support.replay import Transcript, load_transcripts
from tests.support.strategies import split_at

TRANSCRIPTS = load_transcripts(FIXTURES / "streams")
Event = list[Any]
# cut points for any chunking (taken modulo a transcript's length), and how many to draw
CUTS = st.lists(st.integers(min_value=0, max_value=4000), max_size=30)
CHUNKINGS = settings(max_examples=25, deadline=None)


def of(dialect: str) -> list[Any]:
    """The transcripts of one dialect (``Route.name``), as pytest parameters named by file."""
    found = [t for t in TRANSCRIPTS if route_for_path(t.path).name == dialect]
    assert found, f"no transcript of {dialect}"
    return [pytest.param(t, id=t.name) for t in found]


def read(t: Transcript, pieces: list[bytes]) -> tuple[list[Event], Dialect]:
    """The token events the dialect of ``t``'s path finds in ``pieces``, and its end state."""
    dialect = route_for_path(t.path).dialect()
    events: list[Event] = []
    kind = detect_stream(t.content_type)
    if kind not in ("sse", "ndjson"):
        dialect.on_body(loads(b"".join(pieces)))
        return events, dialect
    decoder: Framing = SseDecoder() if kind == "sse" else NdjsonDecoder()

    def consume(payloads: list[bytes]) -> None:
        for payload in payloads:
            before = dialect.reasoning_chunks
            tokens = dialect.on_data(payload)
            if tokens:  # choice 0 unless the dialect put them in ``pending``
                ((choice, tokens),) = dialect.pending.items() or [(0, tokens)]
                dialect.pending.clear()
                events.append([choice, tokens, "reasoning" if dialect.reasoning_chunks > before
                               else "text"])  # fmt: skip

    for piece in pieces:
        consume(decoder.payloads(piece))
    consume(decoder.flush_payloads())
    return events, dialect


def check(t: Transcript, events: list[Event], dialect: Dialect) -> None:
    """The events and end state ``t`` expects: counts, their source, usage, the finish."""
    x = t.expected
    assert events == x["events"]
    counted = sum(e[1] for e in events)
    total = dialect.output_tokens if dialect.output_tokens is not None else counted
    assert total == x["output_tokens"]
    assert ("usage" if dialect.output_tokens is not None else "counted") == x["token_source"]
    assert dialect.input_tokens == x["input_tokens"]
    assert dialect.finish_reason == x["finish_reason"]
    reasoning = dialect.reasoning_tokens
    if reasoning is None and dialect.reasoning_chunks:
        reasoning = dialect.reasoning_chunks
    assert (reasoning or 0) == x.get("reasoning_tokens", 0)
    assert (dialect.cached_tokens or 0) == x.get("cached_tokens", 0)
    assert dialect.engine_prompt_eval_s == pytest.approx(x.get("engine_prompt_eval_s"))
    assert dialect.engine_load_s == pytest.approx(x.get("engine_load_s"))
    assert dialect.malformed == 0


def check_splits(t: Transcript) -> None:
    """``t`` read in two pieces, cut at each byte in turn, then in the pieces of drawn cuts
    (hypothesis): the same events and end state each time."""
    body = t.body
    for cut in range(len(body) + 1):
        check(t, *read(t, [body[:cut], body[cut:]]))

    @CHUNKINGS
    @given(cuts=CUTS)
    def any_chunking(cuts: list[int]) -> None:
        check(t, *read(t, split_at(body, cuts)))

    any_chunking()


def first_output_chunk(t: Transcript) -> int:
    """Which of ``t``'s scheduled chunks carries its first output event."""
    for index in range(len(t.chunks)):
        body = b"".join(data for _, data in t.chunks[: index + 1])
        if read(t, [body])[0]:
            return index
    raise AssertionError(f"{t.name} has no output")
