"""TGI's native API (``observe.dialects.tgi``): one token an event, its special EOS token
counted too (it took a decode step); the last event's ``details`` give the engine's count,
its finish reason and the input length (or, of /generate, the prefill tokens listed); an
``error`` is the engine's error. Checked against the transcripts in tests/fixtures/streams/
at any chunking too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmobs.observe.dialects.tgi import TgiStream
from tests.support.replay import Transcript
from tests.support.transcripts import check_splits, of


def event(token: object, **fields: Any) -> bytes:
    return json.dumps({"token": token, "generated_text": None, "details": None, **fields}).encode()


@pytest.mark.parametrize(
    ("token", "tokens"),
    [
        ({"id": 25, "text": " the", "logprob": -0.5, "special": False}, 1),
        ({"id": 2, "text": "</s>", "special": True}, 1),  # the EOS: generated, not shown
        ({"id": 2, "text": "", "special": True}, 1),
        ({"text": "</s>", "special": True}, 1),
        ({"special": True}, 0),  # nothing to say it is a token
        ({"id": 7, "text": "", "special": False}, 0),
        ("the", 0),
        (None, 0),
    ],
)
def test_each_event_is_one_token_its_eos_included(token: object, tokens: int) -> None:
    dialect = TgiStream()
    assert dialect.on_data(event(token)) == tokens
    assert (dialect.error, dialect.malformed, dialect.finish_reasons) == (False, 0, [])


def test_the_last_details_give_the_engines_count_reason_and_input_length() -> None:
    dialect = TgiStream()
    dialect.captured = []
    dialect.on_data(event({"id": 1, "text": "Hi", "special": False}))
    details = {"finish_reason": "eos_token", "generated_tokens": 2, "input_length": 7}
    last = event({"id": 2, "text": "</s>", "special": True}, details=details)
    assert dialect.on_data(last) == 1
    assert (dialect.output_tokens, dialect.input_tokens) == (2, 7)
    assert dialect.finish_reason == "stop"
    assert dialect.captured == ["Hi"]  # the special token's text is not output text


@pytest.mark.parametrize(
    ("details", "inputs"),
    [
        ({"prefill": [{"id": 1}, {"id": 2}, {"id": 3}]}, 3),  # decoder_input_details
        ({"prefill": [], "input_length": 5}, 5),
        ({"prefill": [{"id": 1}], "input_length": 5}, 5),  # the length, when it says
        ({"prefill": []}, None),  # not asked for
        ({"prefill": "x", "input_length": "5"}, None),
    ],
)
def test_a_whole_body_gives_its_details(details: dict[str, Any], inputs: int | None) -> None:
    dialect = TgiStream()
    body = {"generated_text": "Hi", "details": {"finish_reason": "length",
            "generated_tokens": 4, **details}}  # fmt: skip
    dialect.on_body(body)
    assert (dialect.input_tokens, dialect.output_tokens) == (inputs, 4)
    assert (dialect.finish_reason, dialect.error) == ("length", False)


def test_an_error_is_the_engines_error() -> None:
    streamed = TgiStream()
    assert streamed.on_data(json.dumps({"error": "overloaded", "error_type": "x"}).encode()) == 0
    assert (streamed.error, streamed.finish_reason) == (True, "error")
    whole = TgiStream()
    whole.on_body({"error": "Input validation error", "error_type": "validation"})
    assert whole.error
    assert whole.finish_reasons == []  # a refusal's label is the observer's to decide


@pytest.mark.parametrize("t", of("tgi"))
def test_each_transcript_under_any_chunking(t: Transcript) -> None:
    check_splits(t)
