"""What every dialect shares (``observe.dialects.base``): an engine's finish reason mapped onto
the label's closed set, usage read only from real integers, an event that is not a JSON object
counted as malformed, output accounted to its choice (choice 0's share being what ``pending``
does not hold), captured text and finish reasons bounded, and ``Passthrough`` counting
nothing for a path of no known API."""

from __future__ import annotations

from typing import Any

import pytest

from llmobs.observe.dialects.base import (
    CAPTURE_LIMIT,
    FINISH_REASONS,
    JSON_PARSER,
    MAX_FINISH_REASONS,
    NONE,
    Dialect,
    Passthrough,
    as_int,
    loads,
    normalize_finish,
)
from llmobs.observe.labels import OTHER
from tests.support.replay import Transcript
from tests.support.transcripts import check_splits, of


class Counting(Dialect):
    """A dialect whose events say how many tokens they carry (``{"n": 2}``), and of which
    choice: the base class's own work, with nothing of a real format's."""

    __slots__ = ()

    def on_object(self, obj: dict[str, Any]) -> int:
        return self.output(obj.get("n", 0), obj.get("choice", 0), obj.get("reasoning", False))


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        ("stop", "stop"),
        ("end_turn", "stop"),  # Anthropic
        ("stop_sequence", "stop"),
        ("eos_token", "stop"),  # TGI
        ("length", "length"),
        ("max_tokens", "length"),
        ("max_output_tokens", "length"),  # the Responses API
        ("tool_calls", "tool_calls"),
        ("function_call", "tool_calls"),  # OpenAI's older name
        ("tool_use", "tool_calls"),
        ("content_filter", "content_filter"),
        ("refusal", "content_filter"),
        ("abort", "aborted"),
        ("error", "error"),
        ("pause_turn", OTHER),
        ("Stop", OTHER),  # names are matched exactly
        ("", OTHER),
        ("x" * 1000, OTHER),
    ],
)
def test_a_finish_reason_is_mapped_onto_the_closed_set(raw: str, label: str) -> None:
    assert normalize_finish(raw) == label
    assert label in FINISH_REASONS


USAGE_VALUES = [(0, 0), (7, 7), (-3, -3), (2**70, 2**70), (True, None), (False, None),
                (7.0, None), ("7", None), (None, None), ([7], None)]  # fmt: skip


@pytest.mark.parametrize(("value", "expected"), USAGE_VALUES)
def test_only_an_integer_that_is_not_a_bool_is_usage(value: object, expected: int | None) -> None:
    assert as_int(value) == expected


def test_the_json_parser_is_named_and_parses_bytes() -> None:
    assert JSON_PARSER in ("orjson", "json")
    assert loads(b'{"a": [1, "\\u00e9"]}') == {"a": [1, "é"]}


@pytest.mark.parametrize("data", [b"{", b"", b"[1, 2]", b"3", b'"s"', b"null", b"\xff{}"])
def test_an_event_that_is_not_a_json_object_is_malformed(data: bytes) -> None:
    dialect = Counting()
    assert dialect.on_data(data) == 0
    assert dialect.malformed == 1
    assert dialect.on_data(b'{"n": 2}') == 2
    assert dialect.malformed == 1


def test_the_base_reads_no_format_of_its_own() -> None:
    with pytest.raises(NotImplementedError):
        Dialect().on_data(b"{}")
    body = Counting()
    body.on_body({"n": 3, "choice": 1})  # a whole body is read as one event
    assert body.pending == {1: 3}


def test_output_of_other_choices_is_pending_and_choice_0_is_the_rest() -> None:
    dialect = Counting()
    assert dialect.output(2) == 2
    assert dialect.output(3, choice=1) == 3
    assert dialect.output(1, choice=1) == 1
    assert dialect.output(4, choice=2, reasoning=True) == 4
    assert dialect.output(0, choice=3, reasoning=True) == 0  # no output: nothing noted
    assert dialect.pending == {1: 4, 2: 4}
    assert dialect.reasoning_chunks == 1  # one event of reasoning, whatever its tokens
    taken = dialect.take_pending()
    assert taken == {1: 4, 2: 4}
    assert dialect.pending == {}
    dialect.output(1, choice=1)
    assert taken == {1: 4, 2: 4}  # what was taken is the caller's
    assert dialect.take_pending() == {1: 1}


def test_text_is_kept_only_when_captured_and_up_to_its_bound() -> None:
    quiet = Counting()
    quiet.keep("text")
    assert quiet.captured is None
    dialect = Counting()
    dialect.captured = []
    for text in ("a", None, 7, "", "b" * (CAPTURE_LIMIT - 1), "over", "more"):
        dialect.keep(text)
    # the piece that reaches the bound is kept whole, and nothing after it
    assert dialect.captured == ["a", "", "b" * (CAPTURE_LIMIT - 1)]
    dialect.keep("x")
    assert "".join(dialect.captured) == "a" + "b" * (CAPTURE_LIMIT - 1)


def test_the_finish_reason_is_the_first_named_and_the_list_is_bounded() -> None:
    dialect = Counting()
    assert dialect.finish_reason == NONE
    for raw in (None, "", 3, ["stop"]):  # not a reason
        dialect.finish(raw)
    assert dialect.finish_reasons == []
    dialect.finish("length")
    for _ in range(MAX_FINISH_REASONS + 10):
        dialect.finish("end_turn")
    assert dialect.finish_reason == "length"
    assert len(dialect.finish_reasons) == MAX_FINISH_REASONS
    assert dialect.finish_reasons[1] == "stop"


@pytest.mark.parametrize("data", [b'{"n": 5}', b"{", b"\xff", b"[DONE]"])
def test_passthrough_counts_nothing_and_finds_nothing_malformed(data: bytes) -> None:
    dialect = Passthrough()
    assert dialect.on_data(data) == 0
    assert dialect.on_object({"choices": [{"delta": {"content": "x"}}]}) == 0
    assert (dialect.malformed, dialect.input_tokens, dialect.output_tokens) == (0, None, None)
    assert dialect.finish_reason == NONE


@pytest.mark.parametrize("t", of("none"))
def test_each_transcript_under_any_chunking(t: Transcript) -> None:
    check_splits(t)
