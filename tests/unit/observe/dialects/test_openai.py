"""The OpenAI-compatible chat and completions stream (``observe.dialects.openai``): which
deltas are output (text, refusal, tool arguments; reasoning as reasoning), each choice on its
own, usage taken per chunk only once it proves continuous, the engine's own prefill and queue
times (llama.cpp's ``timings``, vLLM's ``metrics``); and the template fast path, which counts a
plain token event without parsing it, held to the full parse's state on generated events
(hypothesis), with ``WholeEvent``, the same event framed. Checked against the transcripts in
tests/fixtures/streams/ at any chunking too."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmobs.observe.dialects.openai import (
    DONE,
    OpenAIStream,
    Template,
    WholeEvent,
    json_string_body,
)
from llmobs.observe.framing import SseDecoder
from tests.support.openai_events import dumps, events, plain_words, state, texts
from tests.support.replay import Transcript
from tests.support.strategies import FAST
from tests.support.transcripts import check_splits, of

HEAD = b'{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
TAIL = b'"},"finish_reason":null}]}'


def plain(word: bytes, head: bytes = HEAD) -> bytes:
    """A plain token event of the common shape, its content ``word`` (raw JSON)."""
    return head + b'"delta":{"content":"' + word + TAIL


def chunk(*choices: object, **fields: Any) -> bytes:
    return json.dumps({"id": "c", "model": "m", "choices": list(choices), **fields}).encode()


@pytest.mark.parametrize(
    ("delta", "tokens", "reasoning"),
    [
        ({"content": "a"}, 1, 0),
        ({"refusal": "no"}, 1, 0),
        ({"reasoning_content": "so"}, 1, 1),
        ({"reasoning": "so"}, 1, 1),  # vLLM's newer name
        ({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}, 1, 0),
        ({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ""}}]}, 0, 0),
        ({"tool_calls": ["x", {"function": "f"}]}, 0, 0),
        ({"tool_calls": {"function": {"arguments": "x"}}}, 0, 0),
        ({"role": "assistant", "content": ""}, 0, 0),
        ({}, 0, 0),
        ({"content": None, "reasoning_content": None}, 0, 0),
    ],
)
def test_a_delta_of_text_refusal_tool_arguments_or_reasoning_is_a_token(
    delta: dict[str, Any], tokens: int, reasoning: int
) -> None:
    dialect = OpenAIStream()
    assert dialect.on_data(chunk({"index": 0, "delta": delta})) == tokens
    assert dialect.reasoning_chunks == reasoning
    assert (dialect.pending, dialect.malformed, dialect.error) == ({}, 0, False)


def test_completions_text_and_a_whole_message_are_output() -> None:
    dialect = OpenAIStream()
    assert dialect.on_data(chunk({"index": 0, "text": " Hi"})) == 1
    assert dialect.on_data(chunk({"index": 0, "text": ""})) == 0
    assert dialect.on_data(chunk({"index": 0, "message": {"content": "all"}})) == 1
    assert dialect.on_data(chunk("not a choice", {"index": 0, "text": "x"})) == 1


def test_a_chunk_carrying_several_choices_counts_each() -> None:
    """vLLM sends one choice per chunk; a gateway may merge them: each choice's token is
    its own (accounted by its index), not one token of the first."""
    dialect = OpenAIStream()
    data = chunk(
        {"index": 0, "delta": {"content": "a"}},
        {"index": 1, "delta": {"content": "b"}},
        {"index": 2, "delta": {"reasoning_content": "c"}},
        {"index": 3, "delta": {}},
    )
    assert dialect.on_data(data) == 3
    assert dialect.pending == {1: 1, 2: 1}  # choice 0's share is the rest
    assert dialect.reasoning_chunks == 1


@pytest.mark.parametrize("index", [64, 70, -1, None, "1", 1.0])
def test_a_choice_index_out_of_bounds_counts_for_choice_0(index: object) -> None:
    dialect = OpenAIStream()
    assert dialect.on_data(chunk({"index": index, "delta": {"content": "a"}})) == 1
    assert dialect.pending == {}


def test_done_ends_the_stream_and_an_error_is_the_engines() -> None:
    dialect = OpenAIStream()
    assert dialect.on_data(DONE) == 0
    assert (dialect.done, dialect.malformed) == (True, 0)
    failed = OpenAIStream()
    assert failed.on_data(chunk(error={"message": "engine died"})) == 0
    assert failed.error
    assert failed.on_data(b"[1]") == 0 and failed.on_data(b"{") == 0
    assert failed.malformed == 2


def test_the_first_finish_reason_is_the_requests() -> None:
    dialect = OpenAIStream()
    dialect.on_data(chunk({"index": 1, "delta": {}, "finish_reason": "function_call"},
                          {"index": 0, "delta": {}, "finish_reason": "stop"}))  # fmt: skip
    dialect.on_data(chunk({"index": 2, "delta": {}, "finish_reason": ""}))
    assert dialect.finish_reasons == ["tool_calls", "stop"]
    assert dialect.finish_reason == "tool_calls"


def test_the_first_chunk_names_the_response() -> None:
    dialect = OpenAIStream()
    dialect.on_data(json.dumps({"id": 3, "model": ["m"], "choices": []}).encode())
    dialect.on_data(chunk())
    dialect.on_data(json.dumps({"id": "later", "model": "other", "choices": []}).encode())
    assert (dialect.response_id, dialect.response_model) == ("c", "m")


def test_usage_is_per_chunk_only_from_its_second_chunk_with_choices() -> None:
    """A single chunk with choices and usage (llama.cpp's and TGI's last) proves nothing;
    from the second, each chunk's tokens are the difference, an EOS chunk's carried on."""
    dialect = OpenAIStream()
    text = {"index": 0, "delta": {"content": "a"}}
    assert dialect.on_data(chunk(text, usage={"completion_tokens": 1})) == 1
    assert not dialect.per_chunk_usage
    assert dialect.on_data(chunk(text, usage={"completion_tokens": 4})) == 3
    assert dialect.per_chunk_usage
    eos = {"index": 0, "delta": {}}
    assert dialect.on_data(chunk(eos, usage={"completion_tokens": 5})) == 0
    assert dialect.on_data(chunk(text, usage={"completion_tokens": 7})) == 3  # with the EOS's
    assert dialect.on_data(chunk(text, usage={"completion_tokens": 7})) == 1  # at least one
    assert dialect.output_tokens == 7
    usage = {"prompt_tokens": 12, "completion_tokens": 9,
             "prompt_tokens_details": {"cached_tokens": 8},
             "completion_tokens_details": {"reasoning_tokens": 5}}  # fmt: skip
    assert dialect.on_data(chunk(usage=usage)) == 0  # the final usage chunk: no choices
    assert (dialect.input_tokens, dialect.output_tokens) == (12, 9)
    assert (dialect.cached_tokens, dialect.reasoning_tokens) == (8, 5)


def test_usage_fields_that_are_not_integers_are_not_read() -> None:
    dialect = OpenAIStream()
    usage = {"prompt_tokens": "12", "completion_tokens": 9.0,
             "prompt_tokens_details": {"cached_tokens": True},
             "completion_tokens_details": {"reasoning_tokens": None}}  # fmt: skip
    assert dialect.on_data(chunk({"index": 0, "delta": {"content": "a"}}, usage=usage)) == 1
    assert (dialect.input_tokens, dialect.output_tokens) == (None, None)
    assert (dialect.cached_tokens, dialect.reasoning_tokens) == (None, None)


@pytest.mark.parametrize(
    ("timings", "prefill"),
    [
        ({"prompt_ms": 12.5, "predicted_ms": 80}, 0.0125),
        ({"prompt_ms": -4}, 0.0),
        ({"prompt_ms": True}, None),
        ({"predicted_ms": 3}, None),
    ],
)
def test_llamacpps_timings_give_the_engines_prefill(
    timings: dict[str, Any], prefill: float | None
) -> None:
    """llama.cpp's last chunk (its finish or its usage chunk) carries ``timings``."""
    dialect = OpenAIStream()
    dialect.on_data(chunk({"index": 0, "delta": {}, "finish_reason": "stop"}, timings=timings))
    assert dialect.engine_prompt_eval_s == prefill
    busy = OpenAIStream()  # a chunk with output is not the last: its timings are not read
    busy.on_data(chunk({"index": 0, "delta": {"content": "a"}}, timings={"prompt_ms": 5}))
    assert busy.engine_prompt_eval_s is None


@pytest.mark.parametrize(
    ("metrics", "queue", "prefill"),
    [
        ({"queue_time_ms": 12.5, "time_to_first_token_ms": 80}, 0.0125, 0.08),
        ({"queue_time_ms": -3, "time_to_first_token_ms": True}, 0.0, None),
        ({"generation_time_ms": 5}, None, None),
    ],
)
def test_vllm_per_request_metrics_give_the_engines_queue_and_prefill(
    metrics: dict[str, Any], queue: float | None, prefill: float | None
) -> None:
    """vLLM's ``metrics`` (--enable-per-request-metrics), on a stream's last chunk or in a
    whole body: a negative time is none, a value that is not a number is not read."""
    streamed = OpenAIStream()
    streamed.on_data(json.dumps({"id": "c", "choices": [], "metrics": metrics}).encode())
    whole = OpenAIStream()
    whole.on_body({"id": "c", "choices": [], "usage": {"completion_tokens": 1}, "metrics": metrics})
    for dialect in (streamed, whole):
        assert (dialect.engine_queue_s, dialect.engine_prompt_eval_s) == (queue, prefill)


def test_captured_text_is_every_outputs_and_no_template_is_made() -> None:
    """Capturing needs each event's text: the fast path, which reads none, stays off."""
    dialect = OpenAIStream()
    dialect.captured = []
    dialect.on_data(chunk({"index": 0, "delta": {"reasoning_content": "so", "content": "a"}}))
    dialect.on_data(chunk({"index": 0, "text": "b"}))
    dialect.on_data(plain(b"c"))
    dialect.on_data(plain(b"d"))
    assert dialect.captured == ["soa", "b", "c", "d"]
    assert dialect.template is None


def test_json_string_body() -> None:
    assert json_string_body(b"token")
    assert json_string_body(b'\\"x\\" \\u00e9 \\n')
    assert json_string_body("é".encode())
    for bad in (b"", b'a"b', b"\\x", b"\\ud800", b"\x01", b"\xff", b"\xed\xa0\x80", b"\\"):
        assert not json_string_body(bad), bad


def test_a_template_is_the_bytes_around_an_events_content() -> None:
    event = plain(b"Hi")
    template = Template.of(event, 2)
    assert template is not None
    assert (template.head, template.tail) == (HEAD + b'"delta":{"content":"', b'"' + TAIL[1:])
    assert (template.choice, template.start) == (2, len(template.head))
    assert template.size == len(event) - len(b"Hi")
    assert template.matches(plain(b"other")) and template.matches(plain(b'\\"q\\"'))
    for other in (plain(b""), plain(b"\\x"), plain(b"a", HEAD.replace(b"m", b"n")), b"Hi"):
        assert not template.matches(other), other
    # a content key twice, or its string not told apart: no template
    assert Template.of(HEAD + b'"delta":{"content":"a","x":{"content":"b' + TAIL, 0) is None
    assert Template.of(HEAD + b'"delta":{"content":"' + TAIL, 0) is None
    assert Template.of(HEAD + b'"delta":{"content":"a\\x' + TAIL, 0) is None
    assert Template.of(b'{"choices":[]}', 0) is None


def test_the_fast_path_is_taken_for_the_common_shape() -> None:
    dialect = OpenAIStream()
    for word in (b"a", b"b", b'\\"q\\"', "é".encode()):
        assert dialect.on_data(plain(word))
    assert dialect.template is not None
    assert dialect.pending == {}  # choice 0 is what pending does not hold
    assert dialect.malformed == 0


def test_a_whole_event_is_the_template_framed_and_counts_reads_of_only_those() -> None:
    template = Template.of(plain(b"a"), 0)
    assert template is not None
    decoder = SseDecoder(1 << 20)
    whole = WholeEvent.of(template, decoder, 1 << 20)
    assert whole is not None and whole.decoder is decoder
    framed = [b"data: " + plain(w) + b"\n\n" for w in (b"x", b"two words", b"z")]
    assert whole.count(framed[0]) == 1
    assert whole.count(b"".join(framed)) == 3
    for other in (
        framed[0] + b"data: [DONE]\n\n",  # something else after it
        framed[0][:-1],  # the blank line not there yet
        b"data: " + plain(b"\\n") + b"\n\n",  # an escape: the full path reads it
        b"data: " + plain(b"") + b"\n\n",  # no content
        b"data:" + plain(b"x") + b"\n\n",
        b"",
    ):
        assert whole.count(other) == 0, other
    short = WholeEvent.of(template, decoder, len(framed[0]) - 2)  # the line limit, exactly
    assert short is not None
    assert short.count(framed[0]) == 1 and short.count(framed[1]) == 0


def test_no_whole_event_for_another_choice_or_a_template_with_a_line_break() -> None:
    decoder = SseDecoder(1 << 20)
    assert WholeEvent.of(None, decoder, 1 << 20) is None
    assert WholeEvent.of(Template.of(plain(b"a"), 1), decoder, 1 << 20) is None
    for newline in (b"\n", b"\r"):
        broken = Template.of(plain(b"a", HEAD + newline), 0)
        assert broken is not None
        assert WholeEvent.of(broken, decoder, 1 << 20) is None


@FAST
@given(events())
def test_openai_fast_path_gives_the_full_parse_state(stream: list[bytes]) -> None:
    fast, slow = OpenAIStream(), OpenAIStream()
    slow.fast = False
    for data in stream:
        assert fast.on_data(data) == slow.on_data(data), data
        assert state(fast) == state(slow), data
        fast.pending.clear()
        slow.pending.clear()


@st.composite
def template_streams(draw: st.DrawFn) -> list[bytes]:
    """The common shape first (it makes a template), then the template's bytes around drawn
    content, odd bytes or a raw string body: what the template path decides on, read after
    read (``events`` reaches it only now and then)."""
    compact = draw(st.booleans())
    delta = {"content": draw(plain_words)}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
            "choices": [choice]}  # fmt: skip
    first = dumps(base, compact, draw(st.booleans()))
    sep = b'"content":"' if compact else b'"content": "'
    head, _, rest = first.partition(sep)
    tail = b'"' + rest.partition(b'"')[2]
    out = [first]
    for _ in range(draw(st.integers(1, 12))):
        body = draw(
            plain_words.map(str.encode)
            | texts.map(lambda t: json.dumps(t)[1:-1].encode())  # escaped as JSON would
            | st.binary(max_size=8)
            | st.sampled_from([b"\\x", b"a\\", b"\\", b'a"', b"\x7f", b"\xc3\xa9", b"\xff"])
        )
        out.append(head + sep + body + tail)
    return out


@FAST
@given(template_streams())
def test_openai_template_path_gives_the_full_parse_state(stream: list[bytes]) -> None:
    fast, slow = OpenAIStream(), OpenAIStream()
    slow.fast = False
    for i, data in enumerate(stream):
        assert fast.on_data(data) == slow.on_data(data), data
        assert state(fast) == state(slow), data
        assert i or fast.template is not None  # the first event made one
        fast.pending.clear()
        slow.pending.clear()


@pytest.mark.parametrize("t", of("openai"))
def test_each_transcript_under_any_chunking(t: Transcript) -> None:
    check_splits(t)
