"""Triton's generate extension (``observe.dialects.triton``): an event with text is a token,
unless TensorRT-LLM counts the event's tokens itself (``num_output_tokens``: exact, summed
into the engine's total); the model is the first event's ``model_name``; no finish reason; an
``error`` is the engine's error, a whole body read as one event. Checked against the
transcripts in tests/fixtures/streams/ at any chunking too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmobs.observe.dialects.base import NONE
from llmobs.observe.dialects.triton import TritonStream
from tests.support.replay import Transcript
from tests.support.transcripts import check_splits, of


def event(**fields: Any) -> bytes:
    return json.dumps({"model_name": "ensemble", "model_version": "1", **fields}).encode()


def test_an_event_with_text_is_a_token_when_the_engine_counts_none() -> None:
    dialect = TritonStream()
    dialect.captured = []
    assert [dialect.on_data(event(text_output=t)) for t in ("Hi", " there", "", None)] == [
        1, 1, 0, 0]  # fmt: skip
    assert dialect.on_data(event(text_output=7)) == 0
    assert (dialect.output_tokens, dialect.per_chunk_usage) == (None, False)
    assert dialect.captured == ["Hi", " there", ""]
    assert (dialect.response_model, dialect.finish_reason) == ("ensemble", NONE)


def test_the_engines_own_counts_are_exact_and_summed() -> None:
    dialect = TritonStream()
    counts = [dialect.on_data(event(text_output="ab", num_output_tokens=n,
                                    num_input_tokens=9)) for n in (2, 0, 3)]  # fmt: skip
    assert counts == [2, 0, 3]
    assert (dialect.output_tokens, dialect.input_tokens) == (5, 9)
    assert dialect.per_chunk_usage
    # a count that is no count: the event is a token of its text again
    assert dialect.on_data(event(text_output="c", num_output_tokens=-1)) == 1
    assert dialect.on_data(event(text_output="c", num_output_tokens=True)) == 1
    assert dialect.output_tokens == 5


def test_the_model_is_the_first_events() -> None:
    dialect = TritonStream()
    dialect.on_data(json.dumps({"model_name": 3, "text_output": "a"}).encode())
    dialect.on_data(event(text_output="b"))
    dialect.on_data(json.dumps({"model_name": "other", "text_output": "c"}).encode())
    assert dialect.response_model == "ensemble"


def test_an_error_is_the_engines_error_and_no_token() -> None:
    streamed = TritonStream()
    assert streamed.on_data(event(error="inference failed", text_output="x")) == 0
    assert (streamed.error, streamed.finish_reason) == (True, "error")
    whole = TritonStream()
    whole.on_body({"error": "Request for unknown model: 'ensemble' is not found"})
    assert (whole.error, whole.finish_reason) == (True, "error")


def test_a_whole_body_is_one_event() -> None:
    dialect = TritonStream()
    dialect.on_body({"model_name": "ensemble", "text_output": "Hello there",
                     "num_output_tokens": 2, "num_input_tokens": 4})  # fmt: skip
    assert (dialect.output_tokens, dialect.input_tokens) == (2, 4)
    assert dialect.response_model == "ensemble"


@pytest.mark.parametrize("t", of("triton"))
def test_each_transcript_under_any_chunking(t: Transcript) -> None:
    check_splits(t)
