"""What every dialect of the sim shares (``sim.dialects.base``): reading a body (each bad one a
``BadRequest`` the server answers in the dialect's shape), counting a prompt's tokens, compact
JSON and server-sent events, and the send-time stamp a benchmark subtracts from its arrival
time (``--stamp``). Pure: literal bodies in, literal values out."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from llmobs.sim.dialects.base import (
    RECEIVED_MARK,
    SENT_MARK,
    STAMP_SLOT,
    BadRequest,
    Chunk,
    content_text,
    count_prompt_tokens,
    dumps,
    load_object,
    messages_text,
    model_of,
    optional_int,
    optional_object,
    sse,
    stamp_event,
)


def test_json_is_compact_and_events_are_framed() -> None:
    assert dumps({"a": [1, 2], "b": {"c": None}}) == '{"a":[1,2],"b":{"c":null}}'
    assert sse("ping", '{"type":"ping"}') == b'event: ping\ndata: {"type":"ping"}\n\n'


@pytest.mark.parametrize(
    ("text", "tokens"), [("", 1), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 9, 3), ("é" * 8, 2)]
)
def test_a_prompt_is_a_token_per_four_characters_and_never_none(text: str, tokens: int) -> None:
    assert count_prompt_tokens(text) == tokens


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (None, ""),
        ("hi", "hi"),
        ([{"type": "text", "text": "a"}, {"text": "b"}], "ab"),
        ([{"type": "image_url"}, "loose", {"text": 5}, {"text": "c"}], "c"),  # text parts only
        ([], ""),
    ],
)
def test_a_contents_text_is_a_string_or_its_text_parts(content: Any, text: str) -> None:
    assert content_text(content) == text


@pytest.mark.parametrize("content", [5, {"text": "a"}, True])
def test_content_of_another_kind_is_a_bad_request(content: Any) -> None:
    with pytest.raises(BadRequest, match="content must be a string or a list of content parts"):
        content_text(content)


def test_messages_are_their_contents_in_order() -> None:
    messages = [{"role": "system", "content": "a"}, {"content": [{"text": "b"}]}, {"role": "x"}]
    assert messages_text(messages) == "ab"


@pytest.mark.parametrize(
    ("messages", "name", "problem"),
    [
        (None, "messages", "'messages' is required and must be a non-empty list"),
        ([], "messages", "'messages' is required and must be a non-empty list"),
        ("hi", "messages", "'messages' is required and must be a non-empty list"),
        (None, "input", "'input' is required and must be a non-empty list"),
        ([{"content": "a"}, "b"], "messages", "each message must be an object"),
    ],
)
def test_messages_that_are_not_a_list_of_objects_are_refused(
    messages: Any, name: str, problem: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        messages_text(messages, name)
    assert str(refused.value) == problem


def test_a_body_is_a_json_object() -> None:
    assert load_object(b'{"model": "m", "n": 2}') == {"model": "m", "n": 2}
    with pytest.raises(BadRequest, match=r"^invalid JSON body: "):
        load_object(b"{not json")
    with pytest.raises(BadRequest, match=r"^invalid JSON body: "):
        load_object(b'{"a": "\xff"}')  # not UTF-8
    for raw in (b"[1, 2]", b'"text"', b"null"):
        with pytest.raises(BadRequest, match=r"^the body must be a JSON object$"):
            load_object(raw)


@pytest.mark.parametrize(
    ("body", "minimum", "value"),
    [({}, None, None), ({"n": None}, 1, None), ({"n": 3}, 1, 3), ({"n": 1}, 1, 1),
     ({"n": -2}, None, -2), ({"n": 0}, 0, 0)],
)  # fmt: skip
def test_an_optional_integer(body: dict[str, Any], minimum: int | None, value: int | None) -> None:
    assert optional_int(body, "n", minimum) == value


@pytest.mark.parametrize(
    ("body", "minimum", "problem"),
    [({"n": True}, None, "'n' must be an integer"), ({"n": 1.5}, None, "'n' must be an integer"),
     ({"n": "3"}, None, "'n' must be an integer"), ({"n": 0}, 1, "'n' must be >= 1"),
     ({"n": -1}, 0, "'n' must be >= 0")],
)  # fmt: skip
def test_a_bad_optional_integer_names_its_field(
    body: dict[str, Any], minimum: int | None, problem: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        optional_int(body, "n", minimum)
    assert str(refused.value) == problem


def test_an_optional_object_absent_or_null_is_empty() -> None:
    assert optional_object({}, "options") == {}
    assert optional_object({"options": None}, "options") == {}
    assert optional_object({"options": {"seed": 1}}, "options") == {"seed": 1}
    for bad in ("x", [1], 3):
        with pytest.raises(BadRequest, match=r"^'options' must be an object$"):
            optional_object({"options": bad}, "options")


def test_any_model_is_served_and_none_named_is_the_sims_own() -> None:
    assert model_of({"model": "llama"}, "sim") == "llama"
    for body in ({}, {"model": ""}, {"model": None}, {"model": 7}):
        assert model_of(body, "sim") == "sim"


def test_a_chunk_is_its_tokens_after_those_sent_before() -> None:
    chunk = Chunk((" a", " b", " c"), start=4, last=False)
    assert (chunk.text, chunk.end) == (" a b c", 7)
    assert Chunk((" z",), start=0, last=True).end == 1


def _stamped(received_ns: int | None) -> tuple[str, int, int]:
    """An event whose token ends in the slot, stamped; its text and the clock around it."""
    before = time.monotonic_ns()
    raw = stamp_event(dumps({"text": " lorem" + STAMP_SLOT, "other": STAMP_SLOT}), received_ns)
    after = time.monotonic_ns()
    assert raw.startswith(b"data: {") and raw.endswith(b"}\n\n")
    data = json.loads(raw.removeprefix(b"data: "))
    assert data["other"] == STAMP_SLOT  # only the first slot: the token's
    return data["text"], before, after


def test_the_stamp_is_the_monotonic_clock_just_before_the_write() -> None:
    text, before, after = _stamped(received_ns=None)
    assert text.startswith(" lorem " + SENT_MARK)
    assert RECEIVED_MARK not in text
    assert before <= int(text.removeprefix(" lorem " + SENT_MARK)) <= after


def test_the_first_stamp_says_when_the_engine_had_the_request() -> None:
    text, before, after = _stamped(received_ns=123)
    head = f" lorem {RECEIVED_MARK}123 {SENT_MARK}"
    assert text.startswith(head)
    assert before <= int(text.removeprefix(head)) <= after
