"""The Responses API stream (``observe.dialects.responses``): typed events, each delta of
text, refusal or tool arguments a token, of reasoning (text or summary) a token of reasoning;
the final ``response.completed`` / ``incomplete`` / ``failed`` carries usage and status (an
incomplete response's reason mapped, a failed one an error), and so does a whole body.
Checked against the transcripts in tests/fixtures/streams/ at any chunking too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmobs.observe.dialects.responses import ResponsesStream
from tests.support.replay import Transcript
from tests.support.transcripts import check_splits, of


def event(kind: object, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}).encode()


@pytest.mark.parametrize(
    ("data", "tokens", "reasoning"),
    [
        (event("response.output_text.delta", delta="Hi"), 1, 0),
        (event("response.refusal.delta", delta="No"), 1, 0),
        (event("response.function_call_arguments.delta", delta='{"a"'), 1, 0),
        (event("response.custom_tool_call_input.delta", delta="x"), 1, 0),
        (event("response.reasoning_text.delta", delta="so"), 1, 1),
        (event("response.reasoning_summary_text.delta", delta="so"), 1, 1),
        (event("response.output_text.delta", delta=""), 0, 0),
        (event("response.output_text.delta"), 0, 0),
        (event("response.output_text.done", text="Hi"), 0, 0),  # the whole text again
        (event("response.in_progress", response={}), 0, 0),
        (event(["response.output_text.delta"], delta="x"), 0, 0),  # a type that is no name
        (event(None, delta="x"), 0, 0),
    ],
)
def test_a_delta_of_text_tool_arguments_or_reasoning_is_a_token(
    data: bytes, tokens: int, reasoning: int
) -> None:
    dialect = ResponsesStream()
    assert dialect.on_data(data) == tokens
    assert dialect.reasoning_chunks == reasoning
    assert (dialect.error, dialect.malformed, dialect.pending) == (False, 0, {})


def test_the_completed_response_gives_its_usage_and_ids() -> None:
    dialect = ResponsesStream()
    dialect.on_data(event("response.created", response={"id": "resp_1", "model": "gpt",
                                                        "status": "in_progress"}))  # fmt: skip
    assert (dialect.response_id, dialect.response_model) == ("resp_1", "gpt")
    assert dialect.finish_reasons == []
    usage = {"input_tokens": 9, "output_tokens": 30, "input_tokens_details": {"cached_tokens": 4},
             "output_tokens_details": {"reasoning_tokens": 12}}  # fmt: skip
    done = {"id": "resp_1", "model": "gpt", "status": "completed", "usage": usage}
    assert dialect.on_data(event("response.completed", response=done)) == 0
    assert (dialect.input_tokens, dialect.output_tokens) == (9, 30)
    assert (dialect.cached_tokens, dialect.reasoning_tokens) == (4, 12)
    assert (dialect.finish_reason, dialect.error) == ("stop", False)


@pytest.mark.parametrize(
    ("details", "label"),
    [
        ({"reason": "max_output_tokens"}, "length"),
        ({"reason": "content_filter"}, "content_filter"),
        ({"reason": 3}, "length"),  # no reason it can read: the usual one
        (None, "length"),
    ],
)
def test_an_incomplete_response_finishes_for_its_reason(details: object, label: str) -> None:
    dialect = ResponsesStream()
    response = {"status": "incomplete", "incomplete_details": details}
    dialect.on_data(event("response.incomplete", response=response))
    assert (dialect.finish_reason, dialect.error) == (label, False)


def test_a_failed_response_or_an_error_event_is_the_engines_error() -> None:
    failed = ResponsesStream()
    failed.on_data(event("response.failed", response={"status": "failed"}))
    assert (failed.error, failed.finish_reason) == (True, "error")
    no_body = ResponsesStream()
    no_body.on_data(event("response.failed"))  # the event alone says it failed
    assert (no_body.error, no_body.finish_reasons) == (True, [])
    error = ResponsesStream()
    error.on_data(event("error", code="server_error", message="boom"))
    assert (error.error, error.finish_reason) == (True, "error")


def test_a_whole_body_is_the_response_object() -> None:
    dialect = ResponsesStream()
    dialect.on_body({"id": "resp_2", "status": "completed", "usage": {"input_tokens": 3,
                     "output_tokens": "8", "output_tokens_details": []}})  # fmt: skip
    assert (dialect.input_tokens, dialect.output_tokens) == (3, None)
    assert (dialect.reasoning_tokens, dialect.finish_reason) == (None, "stop")
    bare = ResponsesStream()
    bare.on_body({"status": "queued", "usage": None, "id": 5})
    assert (bare.response_id, bare.finish_reasons, bare.input_tokens) == (None, [], None)


@pytest.mark.parametrize("t", of("openai-responses"))
def test_each_transcript_under_any_chunking(t: Transcript) -> None:
    check_splits(t)
