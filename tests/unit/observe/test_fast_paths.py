"""The hot path's shortcuts against the full paths they skip (hypothesis).

``OpenAIStream``'s template fast path must leave a dialect in exactly the state the full JSON
parse would, event after event, whatever arrives: the common shape with any content (escaped
quotes, ``"content":""``, keys inside values, unicode, control characters), the template's
bytes around arbitrary bytes (invalid escapes, lone surrogates, invalid UTF-8), other choices,
finish reasons, usage, errors, nested objects. ``SseDecoder.payloads``'s fast path must give
the events ``feed`` gives, under any chunking. ``StreamReader``'s whole-read path (a read
that is one plain token event skips decoder and dialect) must give the records of the path
it skips.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmobs.export.metrics import text
from llmobs.export.metrics.sink import MetricsSink
from llmobs.observe.dialects import CHAT, OPENAI_CHAT, Route
from llmobs.observe.dialects.openai import OpenAIStream, json_string_body
from llmobs.observe.framing import SseDecoder
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.timing import Outcome, StreamTimer
from tests.support.strategies import FAST, PIECES, cut_lists, json_values, payloads, split_at

STATE = ("pending", "finish_reasons", "error", "malformed", "done", "response_id",
         "response_model", "input_tokens", "output_tokens", "reasoning_tokens",
         "reasoning_chunks", "cached_tokens", "per_chunk_usage")  # fmt: skip

texts = st.text(max_size=8) | st.sampled_from(
    ['"', '\\', '\\"', '"content":"', '","usage":{"completion_tokens":9},"x":"', "\x00", "\n",
     "\ud7ff", "\U0001f600", "é", "", "index\":1", "\x7f", "null}]}"]
)  # fmt: skip
extra = st.dictionaries(
    st.sampled_from(["system_fingerprint", "usage", "error", "service_tier", "content", "x"]),
    json_values,
    max_size=2,
)
choice_extra = st.dictionaries(
    st.sampled_from(["logprobs", "finish_reason", "stop_reason", "index", "message", "text"]),
    json_values | st.sampled_from([None, 0, 1, "stop"]),
    max_size=2,
)
delta_extra = st.dictionaries(
    st.sampled_from(["role", "reasoning_content", "tool_calls", "refusal", "content"]),
    json_values | st.sampled_from(["assistant", None, ""]),
    max_size=2,
)


@st.composite
def chunk_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly the common shape (vLLM's key order), with drawn departures from it."""
    delta: dict[str, Any] = {"content": draw(texts), **draw(delta_extra)}
    choice: dict[str, Any] = {"index": draw(st.sampled_from([0, 0, 0, 1, 70, -1, None]))}
    choice.update(delta=delta, logprobs=None, finish_reason=None)
    choice.update(draw(choice_extra))
    obj: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                           "created": 1700000000, "model": "m"}  # fmt: skip
    obj["choices"] = draw(st.sampled_from([[choice], [choice], [choice, choice], [], [{}]]))
    obj.update(draw(extra))
    return obj


def dumps(obj: Any, compact: bool, ascii_only: bool) -> bytes:
    separators = (",", ":") if compact else (", ", ": ")
    text = json.dumps(obj, separators=separators, ensure_ascii=ascii_only)
    return text.encode("utf-8", "replace")


@st.composite
def events(draw: st.DrawFn) -> list[bytes]:
    """A stream: a template-shaped event first, then a mix of every kind of event."""
    compact = draw(st.booleans())
    ascii_only = draw(st.booleans())
    base = draw(chunk_objects())
    out = [dumps(base, compact, ascii_only)]
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 4))
        if kind == 0:  # the same event with other content
            content = draw(texts)
            obj = json.loads(out[0])
            for choice in obj.get("choices") or []:
                if isinstance(choice, dict) and isinstance(choice.get("delta"), dict):
                    choice["delta"]["content"] = content
            out.append(dumps(obj, compact, ascii_only))
        elif kind == 1:  # the bytes around the content, around arbitrary bytes
            head, sep, _ = out[0].partition(b'"content":"')
            body = draw(st.binary(max_size=12) | st.sampled_from(
                [b"\\ud800", b"\\u00e9", b"\\ud83d\\ude00", b'\\"', b"\\x", b"\xed\xa0\x80",
                 b"\xc3\xa9", b"\xff", b"\x1f", b'a"', b"\\\\", b"\\"]
            ))  # fmt: skip
            tail = out[0].partition(b'"content":"')[2].partition(b'"')[2]
            out.append(head + sep + body + b'"' + tail if sep else body)
        elif kind == 2:
            out.append(dumps(draw(chunk_objects()), compact, ascii_only))
        elif kind == 3:
            out.append(draw(payloads))
        else:
            out.append(out[-1])
    return out


def state(dialect: OpenAIStream) -> dict[str, Any]:
    return {name: getattr(dialect, name) for name in STATE}


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


def test_the_fast_path_is_taken_for_the_common_shape() -> None:
    head = b'{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    dialect = OpenAIStream()
    tail = b'"},"finish_reason":null}]}'
    for word in (b"a", b"b", b'\\"q\\"', "é".encode()):
        assert dialect.on_data(head + b'"delta":{"content":"' + word + tail)
    assert dialect.template is not None
    assert dialect.pending == {}  # choice 0 is what pending does not hold
    assert dialect.malformed == 0


def test_json_string_body() -> None:
    assert json_string_body(b"token")
    assert json_string_body(b'\\"x\\" \\u00e9 \\n')
    assert json_string_body("é".encode())
    for bad in (b"", b'a"b', b"\\x", b"\\ud800", b"\x01", b"\xff", b"\xed\xa0\x80", b"\\"):
        assert not json_string_body(bad), bad


sse_streams = st.lists(
    st.sampled_from([*PIECES, b'data: {"a":1}\n\n', b"data:x\n\n", b"data: \n\n"])
    | st.binary(max_size=20),
    max_size=40,
).map(b"".join)


@FAST
@given(sse_streams, cut_lists, st.sampled_from([8, 64, 1 << 20]))
def test_sse_payloads_fast_path_gives_the_events_of_feed(
    data: bytes, cuts: list[int], limit: int
) -> None:
    fast, slow = SseDecoder(limit), SseDecoder(limit)
    got: list[bytes] = []
    want: list[bytes] = []
    for chunk in split_at(data, cuts):
        got.extend(fast.payloads(chunk))
        want.extend(e.data for e in slow.feed(chunk))
    got.extend(fast.flush_payloads())
    want.extend(e.data for e in slow.flush())
    assert got == want
    assert (fast.malformed, fast.comments) == (slow.malformed, slow.comments)


class Kept(OpenAIStream):
    """The chat dialect, each instance kept so that a test reads its state at the end."""

    made: ClassVar[list[OpenAIStream]] = []

    def __init__(self) -> None:
        super().__init__()
        Kept.made.append(self)


class Full(Kept):
    """The chat dialect without its template fast path: every event fully parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.fast = False  # so no template, and no read is counted whole


class Counted(OpenAIStream):
    """The chat dialect, counting the events it is given."""

    calls: ClassVar[list[bytes]] = []

    def on_data(self, data: bytes) -> int:
        Counted.calls.append(data)
        return super().on_data(data)


def observe(
    reads: list[bytes], whole: bool, max_line: int
) -> tuple[Any, dict[str, Any], tuple[int, int], str]:
    """A streaming chat request of ``reads``: its record, dialect and decoder state, series.
    ``whole`` False: the reference, with none of the shortcuts (neither the reader's nor the
    dialect's), so that a shortcut wrong in both places is still found."""
    sink = MetricsSink(None, 8)
    route = Route(CHAT, Kept if whole else Full, "openai")
    obs = Observer(sink, ObserveSettings(max_line_bytes=max_line), route, 0)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(0)
    obs.response(200, "text/event-stream")
    for i, data in enumerate(reads):
        obs.chunk((i + 1) * 20_000_000, data)
    record = obs.finish(10**10, Outcome.OK)
    dialect = Kept.made[-1]
    # the decoder's own counts, which no record carries
    decoder = obs._reader._sse
    assert decoder is not None
    series = text.render(sink.collector.frames()).decode()
    return record, state(dialect), (decoder.malformed, decoder.comments), series


plain_words = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7F, exclude_characters='"\\'),
    min_size=1,
    max_size=6,
)


@st.composite
def token_streams(draw: st.DrawFn) -> list[bytes]:
    """``events``, with the first event's bytes around other plain content in between (most
    of a real stream: what the whole-read path takes)."""
    stream = draw(events())
    for sep in (b'"content":"', b'"content": "'):
        head, found, rest = stream[0].partition(sep)
        if found:
            break
    out = []
    for event in stream:
        out.append(event)
        for _ in range(draw(st.integers(0, 4)) if found else 0):
            out.append(head + sep + draw(plain_words).encode() + b'"' + rest.partition(b'"')[2])
    return out


@FAST
@given(token_streams(), cut_lists, st.integers(0, 4), st.integers(-2, 8), st.booleans())
def test_whole_reads_give_what_decoder_and_dialect_give(
    stream: list[bytes], cuts: list[int], per_read: int, over: int, unlimited: bool
) -> None:
    """``Observer``'s whole-read path against the decoder and dialect it skips: one event a
    read (the usual case), several (a busy engine's coalesced reads: ``WholeEvent.count``)
    or reads cut anywhere, line limits at and around the events'."""
    framed = [b"data: " + event + b"\n\n" for event in stream]
    if per_read:
        reads = [b"".join(framed[i : i + per_read]) for i in range(0, len(framed), per_read)]
    else:
        reads = split_at(b"".join(framed), cuts)
    max_line = 1 << 20 if unlimited else len(framed[0]) - 2 + over
    assert observe(reads, True, max_line) == observe(reads, False, max_line)


_HEAD = b'{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
_TAIL = b'"},"finish_reason":null}]}'
ODD_EVENTS = [  # each next to plain token events in one read: not to be counted as one
    _HEAD + b'"delta":{"content":"a\\qb' + _TAIL,  # an invalid escape: malformed
    _HEAD + b'"delta":{"content":"a\x01b' + _TAIL,  # a raw control character: malformed
    _HEAD + b'"delta":{"content":"a\xffb' + _TAIL,  # invalid UTF-8: malformed
    _HEAD + b'"delta":{"content":"a\\nb' + _TAIL,  # an escape: a token, read in full
    _HEAD + b'"delta":{"content":"' + _TAIL,  # no content: no token
    _HEAD.replace(b'"index":0', b'"index":1') + b'"delta":{"content":"a' + _TAIL,  # choice 1
    _HEAD + b'"delta":{"content":"a"},"finish_reason":"stop"}]}',  # the last token
    _HEAD + b'"delta":{"content":"a"},"finish_reason":"ab"}]}',  # a tail of the same length
    _HEAD + b'"delta":{"content":"a","role":"assistant' + _TAIL,  # another key after it
    _HEAD + b'"delta":{"content":"' + b"x" * 200 + _TAIL,  # longer than the line limit
    b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}',
]


@pytest.mark.parametrize("odd", ODD_EVENTS)
@pytest.mark.parametrize("unlimited", [True, False])
def test_coalesced_reads_with_another_event_give_what_decoder_and_dialect_give(
    odd: bytes, unlimited: bool
) -> None:
    """A read of several events is counted whole only when every event in it is a plain
    token event of the template, each within the line limit; anything else in it sends the
    whole read through decoder and dialect. So with a read of one event, between plain
    reads, and with a plain read after a read that left an event unfinished."""
    plain = [b"data: " + _HEAD + b'"delta":{"content":"%d' % i + _TAIL + b"\n\n" for i in range(6)]
    other = b"data: " + odd + b"\n\n"
    reads = [plain[0], plain[1] + other, other + plain[2], plain[3] + plain[4] + other, plain[5]]
    cut = len(plain[0]) // 2  # and after a read that ends inside an event, nothing is whole
    reads += [plain[0] + plain[1][:cut], plain[1][cut:] + plain[2] + plain[3], plain[4] + plain[5]]
    reads += [plain[0][:-1], plain[1] + plain[2]]  # one line: its event takes the next line in
    reads += [plain[3], other, plain[4]]  # alone, between plain reads (the fast path's)
    reads += [plain[0][:-1], plain[1], plain[2]]  # and a plain read after an unfinished event
    max_line = 1 << 20 if unlimited else len(plain[0]) + 8
    assert observe(reads, True, max_line) == observe(reads, False, max_line)


def test_plain_token_reads_skip_decoder_and_dialect() -> None:
    head = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    tail = b'"},"finish_reason":null}]}\n\n'
    sink = MetricsSink(None, 8)
    obs = Observer(sink, ObserveSettings(), Route(CHAT, Counted, "openai"), 0)
    obs.response(200, "text/event-stream")
    calls = Counted.calls
    calls.clear()
    words = [b"a", b" b", b"c", b'\\"q\\"', "é".encode(), b"d"]
    for i, word in enumerate(words):
        obs.chunk(i + 1, head + b'"delta":{"content":"' + word + tail)
    assert len(calls) == 3  # the first (it makes the template), then escapes and non-ASCII
    coalesced = b"".join(head + b'"delta":{"content":"' + w + tail for w in (b"e", b"f", b"g"))
    obs.chunk(len(words) + 1, coalesced)  # three token events in one read: counted whole too
    assert len(calls) == 3
    record = obs.finish(10, Outcome.OK)
    assert record is not None and record.output_tokens == len(words) + 3


def test_a_request_forwarded_after_its_first_token_leaves_the_queue_on_the_next() -> None:
    """The fast path times a read and nothing else, so it must not be armed while the request
    waits in the prefill queue: ``forwarded`` disarms it, and should it come late (the proxy
    forwards before any response; a retry or another caller might not), the next token
    still takes the request out of the queue."""
    head = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    tail = b'"},"finish_reason":null}]}\n\n'
    sink = MetricsSink(None, 8)
    obs = Observer(sink, ObserveSettings(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.response(200, "text/event-stream")
    obs.chunk(1, head + b'"delta":{"content":"a' + tail)  # the template: the fast path armed
    obs.forwarded(2)

    def depth() -> str:
        render = text.render(sink.collector.frames()).decode().splitlines()
        return next(line for line in render if line.startswith("llmobs_prefill_queue_depth"))

    assert depth().endswith(" 1.0")
    obs.chunk(3, head + b'"delta":{"content":"b' + tail)
    assert depth().endswith(" 0.0")
    record = obs.finish(4, Outcome.OK)
    assert record is not None and record.output_tokens == 2


def itl_counts(sink: MetricsSink) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.render(sink.collector.frames()).decode().splitlines()
        if line.startswith("llmobs_inter_token_latency_seconds_count{")
    ]


@pytest.mark.parametrize("per_read", [1, 3])
def test_whole_reads_past_a_window_are_all_timed(per_read: int) -> None:
    """The whole-read path appends to the timer's times itself; a full window is taken and
    the timer starts a new array, which the path must follow: a stream longer than one window
    (65,536 chunks) loses no chunk and no gap, and its ITLs reach the sink window by window,
    the first while the stream goes on. So with reads of several events (``count``)."""
    head = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    tail = b'"},"finish_reason":null}]}\n\n'
    sink = MetricsSink(None, 8)
    obs = Observer(sink, ObserveSettings(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(0)
    obs.response(200, "text/event-stream")
    window = StreamTimer(0).window
    chunks = window + window // 2
    read = (head + b'"delta":{"content":"w' + tail) * per_read
    for i in range(chunks):
        obs.chunk((i + 1) * 1_000_000, read)
    assert itl_counts(sink) and itl_counts(sink)[0] >= window - 1  # the first, mid-stream
    record = obs.finish(10**12, Outcome.OK)
    assert record is not None
    assert (record.chunks, record.output_tokens) == (chunks, chunks * per_read)
    assert record.itl_count == (chunks - 1) * per_read  # a read's gap, shared by its tokens
    assert record.itl_sum == pytest.approx((chunks - 1) / 1000)
    assert record.ttft_s == pytest.approx(0.001)
    assert itl_counts(sink) == [record.itl_count]  # both windows, under the model
