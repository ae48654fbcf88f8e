"""Ollama's native NDJSON API (``observe.dialects.ollama``): a line's ``response`` or
``message.content`` (or tool calls) is a token, its ``thinking`` (top level from
/api/generate, in the message from /api/chat) a token of reasoning; the ``done`` line carries
the engine's own counts, its reason and its prefill and load durations in nanoseconds; an
``error`` line is the engine's error. Checked against the transcripts in
tests/fixtures/streams/ at any chunking too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmobs.observe.dialects.ollama import OllamaStream
from tests.support.replay import Transcript
from tests.support.transcripts import check_splits, of


def line(**fields: Any) -> bytes:
    return json.dumps({"model": "qwen3", "done": False, **fields}).encode()


def test_ollama_generate_counts_its_top_level_thinking_as_reasoning() -> None:
    """``/api/generate`` with ``"think": true`` streams reasoning in a top-level
    ``thinking`` field (``/api/chat`` in ``message.thinking``): it is output, timed as such."""
    dialect = OllamaStream()
    think = line(response="", thinking="hmm")
    assert [dialect.on_data(think) for _ in range(3)] == [1, 1, 1]
    assert dialect.on_data(line(response="ok")) == 1
    assert dialect.reasoning_chunks == 3
    assert dialect.on_data(line(response="")) == 0


@pytest.mark.parametrize(
    ("data", "tokens", "reasoning"),
    [
        (line(message={"role": "assistant", "content": "Blue"}), 1, 0),
        (line(message={"role": "assistant", "content": "", "thinking": "Hmm"}), 1, 1),
        (
            line(
                message={
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
                }
            ),
            1,
            0,
        ),
        (line(message={"role": "assistant", "content": ""}), 0, 0),
        (line(message="Blue"), 0, 0),  # not a message
        (line(response="a", message={"content": "b"}), 1, 0),  # one line, one token
        (line(response="a", thinking="b"), 1, 0),  # the response wins
        (line(), 0, 0),
    ],
)
def test_a_line_with_text_tool_calls_or_thinking_is_a_token(
    data: bytes, tokens: int, reasoning: int
) -> None:
    dialect = OllamaStream()
    assert dialect.on_data(data) == tokens
    assert dialect.reasoning_chunks == reasoning
    assert (dialect.done, dialect.error, dialect.malformed) == (False, False, 0)


def test_the_done_line_gives_the_engines_counts_and_durations() -> None:
    dialect = OllamaStream()
    dialect.captured = []
    dialect.on_data(line(message={"content": "Hi"}))
    last = {"model": "llama3.2", "done": True, "done_reason": "length", "eval_count": 4,
            "prompt_eval_count": 26, "prompt_eval_duration": 107_345_000,
            "load_duration": 534_986_708, "message": {"content": ""}}  # fmt: skip
    assert dialect.on_data(json.dumps(last).encode()) == 0
    assert dialect.done
    assert (dialect.output_tokens, dialect.input_tokens) == (4, 26)
    assert dialect.engine_prompt_eval_s == pytest.approx(0.107345)
    assert dialect.engine_load_s == pytest.approx(0.534986708)
    assert (dialect.finish_reason, dialect.response_model) == ("length", "llama3.2")
    assert dialect.captured == ["Hi"]


def test_a_done_line_without_counts_or_reason_stops_with_none_of_them() -> None:
    dialect = OllamaStream()
    dialect.on_body({"done": True, "eval_count": "4", "prompt_eval_duration": 1.5,
                     "load_duration": True, "model": 7})  # fmt: skip
    assert dialect.done
    assert dialect.finish_reason == "stop"  # done, no reason given
    assert (dialect.output_tokens, dialect.input_tokens) == (None, None)
    assert (dialect.engine_prompt_eval_s, dialect.engine_load_s) == (None, None)
    assert dialect.response_model is None
    not_done = OllamaStream()
    not_done.on_data(line(done="true", eval_count=4))  # only JSON's true ends the stream
    assert (not_done.done, not_done.output_tokens) == (False, None)


def test_an_error_line_is_the_engines_error() -> None:
    dialect = OllamaStream()
    assert dialect.on_data(line(error="model runner crashed", response="x")) == 0
    assert dialect.error
    assert dialect.finish_reason == "error"


@pytest.mark.parametrize("t", of("ollama"))
def test_each_transcript_under_any_chunking(t: Transcript) -> None:
    check_splits(t)
