"""The Messages API stream (``observe.dialects.anthropic``): text, tool input and thinking
deltas are output (thinking as reasoning), a signature is not; ``message_start`` gives the
input usage but not an output total (its count is a placeholder), ``message_delta`` the stop
reason and the engine's total; an ``error`` event, or an error body, is the engine's error.
Checked against the transcripts in tests/fixtures/streams/ at any chunking too."""

from __future__ import annotations

import json

import pytest

from llmobs.observe.dialects.anthropic import AnthropicStream
from tests.support.replay import Transcript
from tests.support.transcripts import check_splits, of


def event(obj: object) -> bytes:
    return json.dumps(obj).encode()


def delta(kind: str, **fields: object) -> bytes:
    return event({"type": "content_block_delta", "index": 0, "delta": {"type": kind, **fields}})


START = event({"type": "message_start", "message": {"id": "msg_1", "model": "claude",
              "usage": {"input_tokens": 10, "cache_read_input_tokens": 4,
                        "output_tokens": 1}}})  # fmt: skip


def test_an_anthropic_stream_cut_before_its_end_is_counted_by_its_chunks() -> None:
    """``message_start``'s output count is a placeholder (1 from Anthropic, 0 from vLLM): a
    stream the client left before ``message_delta`` must not report it as the engine's total."""
    dialect = AnthropicStream()
    assert dialect.on_data(START) == 0
    assert sum(dialect.on_data(delta("text_delta", text="hi")) for _ in range(5)) == 5
    assert (dialect.input_tokens, dialect.cached_tokens) == (10, 4)
    assert (dialect.response_id, dialect.response_model) == ("msg_1", "claude")
    assert dialect.output_tokens is None  # counted, not the placeholder
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
           "usage": {"output_tokens": 5}}  # fmt: skip
    dialect.on_data(event(end))
    assert dialect.output_tokens == 5
    assert dialect.finish_reason == "stop"
    assert not dialect.done
    dialect.on_data(event({"type": "message_stop"}))
    assert dialect.done


@pytest.mark.parametrize(
    ("data", "tokens", "reasoning"),
    [
        (delta("text_delta", text="hi"), 1, 0),
        (delta("input_json_delta", partial_json='{"city": '), 1, 0),  # a tool call's input
        (delta("thinking_delta", thinking="hmm"), 1, 1),
        (delta("signature_delta", signature="EqQB"), 0, 0),  # not output
        (delta("text_delta", text=""), 0, 0),
        (delta("thinking_delta", thinking=""), 0, 0),
        (delta("input_json_delta", partial_json=""), 0, 0),
        (delta("text_delta"), 0, 0),
        (delta("citations_delta", citation={}), 0, 0),
        (event({"type": "content_block_delta", "delta": "text"}), 0, 0),
        (event({"type": "content_block_delta", "delta": {"type": ["text_delta"]}}), 0, 0),
        (event({"type": "content_block_start", "content_block": {"type": "text"}}), 0, 0),
        (event({"type": "ping"}), 0, 0),
    ],
)
def test_a_delta_of_text_tool_input_or_thinking_is_a_token(
    data: bytes, tokens: int, reasoning: int
) -> None:
    dialect = AnthropicStream()
    dialect.captured = []
    assert dialect.on_data(data) == tokens
    assert dialect.reasoning_chunks == reasoning
    assert (dialect.malformed, dialect.error) == (0, False)
    assert bool("".join(dialect.captured)) is bool(tokens)  # its text, kept when captured


def test_an_error_event_is_the_engines_error() -> None:
    dialect = AnthropicStream()
    dialect.on_data(START)
    dialect.on_data(event({"type": "error", "error": {"type": "overloaded_error",
                                                     "message": "Overloaded"}}))  # fmt: skip
    assert dialect.error
    assert dialect.finish_reason == "error"


def test_usage_fields_that_are_not_integers_are_not_read() -> None:
    dialect = AnthropicStream()
    start = {"type": "message_start", "message": {"usage": {"input_tokens": "10",
             "cache_read_input_tokens": True}}}  # fmt: skip
    dialect.on_data(event(start))
    dialect.on_data(event({"type": "message_delta", "delta": "end",
                           "usage": {"output_tokens": 2.0}}))  # fmt: skip
    dialect.on_data(event({"type": "message_delta", "usage": [1]}))
    assert (dialect.input_tokens, dialect.cached_tokens, dialect.output_tokens) == (None,) * 3
    assert dialect.finish_reasons == []


def test_a_whole_body_gives_its_usage_and_stop_reason() -> None:
    dialect = AnthropicStream()
    dialect.on_body({"id": "msg_2", "type": "message", "model": "claude", "content": [],
                     "stop_reason": "max_tokens",
                     "usage": {"input_tokens": 3, "output_tokens": 16}})  # fmt: skip
    assert (dialect.input_tokens, dialect.output_tokens) == (3, 16)  # final: the total
    assert (dialect.finish_reason, dialect.response_id) == ("length", "msg_2")
    refused = AnthropicStream()
    refused.on_body({"type": "error", "error": {"type": "invalid_request_error", "message": "x"}})
    assert refused.error
    assert (refused.finish_reasons, refused.input_tokens) == ([], None)


@pytest.mark.parametrize("t", of("anthropic"))
def test_each_transcript_under_any_chunking(t: Transcript) -> None:
    check_splits(t)
