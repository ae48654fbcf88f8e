"""The stream reader (``observe.reader.StreamReader``): a body's reads, at the times they were
relayed, through the framing its Content-Type names and the route's dialect, to the request
clock; a JSON body kept (bounded) and read once at its end; the prefill queue left at the
first output; an error counted and logged once and never raised. Its whole-read path, which
counts a read of plain token events without decoder or dialect, held to the records of the
path it skips (hypothesis), as the observer that holds the reader gives them."""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmobs.export.metrics import text
from llmobs.export.metrics.sink import MetricsSink
from llmobs.observe.clock import RequestClock
from llmobs.observe.dialects import CHAT, OPENAI_CHAT, Route
from llmobs.observe.dialects.base import Dialect
from llmobs.observe.dialects.ollama import OllamaStream
from llmobs.observe.dialects.openai import OpenAIStream
from llmobs.observe.dialects.tgi import TgiStream
from llmobs.observe.observer import Observer, ObserveSettings
from llmobs.observe.reader import MAX_JSON_BODY, StreamReader
from llmobs.observe.saturation import PrefillBacklog
from llmobs.observe.timing import Outcome, StreamTimer
from tests.support.live_counts import FakeCounts
from tests.support.openai_events import state, token_streams
from tests.support.recording import recording
from tests.support.strategies import FAST, cut_lists, split_at

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
HEAD = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
TAIL = b'"},"finish_reason":null}]}\n\n'


def token(word: bytes) -> bytes:
    """A plain chat token event, framed."""
    return HEAD + b'"delta":{"content":"' + word + TAIL


def line(**fields: Any) -> bytes:
    """An Ollama NDJSON line."""
    return json.dumps({"model": "m", "done": False, **fields}).encode() + b"\n"


class Raising(OllamaStream):
    """Ollama's dialect, failing on any event after its first."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def on_data(self, data: bytes) -> int:
        self.seen += 1
        if self.seen > 1:
            raise RuntimeError("boom")
        return super().on_data(data)


def reader(
    dialect: Dialect,
    content_type: str | None = None,
    counts: FakeCounts | None = None,
    max_line: int = 1 << 20,
) -> tuple[StreamReader, RequestClock, FakeCounts]:
    """A reader of a request that started at 0, its clock and its counts; with a content
    type, the response's headers arrived."""
    clock = RequestClock(0, lambda window: None)
    counts = FakeCounts() if counts is None else counts
    read = StreamReader(clock, dialect, counts, max_line)
    if content_type is not None:
        read.response(content_type)
    return read, clock, counts


def timed(clock: RequestClock) -> list[tuple[int | None, int]]:
    """Each choice's first output time and tokens, choice 0 first."""
    timers, _ = clock.close(None)
    return [(timer.first_ns, timer.tokens) for timer in timers]


def test_a_stream_is_timed_at_each_read_that_ends_an_event() -> None:
    read, clock, _ = reader(OllamaStream(), NDJSON)
    first = line(response="a")
    read.chunk(10, first[:5])  # no event ends in it: nothing timed
    read.chunk(20, first[5:] + line(response="b")[:3])
    read.chunk(30, line(response="b")[3:] + line(response="c") + line(response="d"))
    read.chunk(40, line(response="", done=True, eval_count=4))
    assert clock.tape.tolist() == [20, 30]  # a read is one chunk, of all its tokens
    assert timed(clock) == [(20, 4)]
    assert read.close(True) == (True, 0)
    assert read.dialect.done


def test_the_last_event_without_its_end_is_read_only_if_the_stream_was_not_cut() -> None:
    """A stream's last event may lack its blank line; a cut stream's partial last event is
    not evidence of anything."""
    for complete, tape in ((True, [10, 20]), (False, [10])):
        read, clock, _ = reader(OpenAIStream(), SSE)
        read.chunk(10, token(b"a"))
        read.chunk(20, token(b"b\\n")[:-2])  # the full path: an escape
        assert clock.tape.tolist() == [10]
        assert read.close(complete) == (True, 0)
        assert clock.tape.tolist() == tape, complete


def test_what_the_decoder_or_the_dialect_cannot_read_is_counted() -> None:
    read, clock, _ = reader(OllamaStream(), NDJSON, max_line=64)
    read.chunk(10, b"{not json\n" + b'{"response": "' + b"x" * 100 + b'"}\n' + line(response="a"))
    read.chunk(20, b"[1, 2]\n")
    assert read.close(True) == (True, 3)  # two the dialect could not read, one too long
    assert clock.tape.tolist() == [10]


def test_a_json_body_is_kept_and_read_at_its_end() -> None:
    read, clock, _ = reader(TgiStream(), "application/json")
    body = json.dumps({"generated_text": "Hi", "details": {"finish_reason": "length",
                       "generated_tokens": 9}}).encode()  # fmt: skip
    read.chunk(10, body[:7])
    read.chunk(20, body[7:])
    assert read.dialect.finish_reasons == []  # nothing read before the end
    assert read.close(True) == (False, 0)
    assert (read.dialect.output_tokens, read.dialect.finish_reason) == (9, "length")
    assert clock.tape.tolist() == []  # a whole body has no output chunks to time


def test_a_body_that_is_a_list_of_one_generation_is_that_generation() -> None:
    """TGI's compat route (POST /) wraps its one generation in a list."""
    read, _, _ = reader(TgiStream(), "application/json")
    read.chunk(10, b'[{"generated_text": "Hi", "details": {"generated_tokens": 3}}]')
    read.close(True)
    assert read.dialect.output_tokens == 3


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b"Bad Gateway"),  # not JSON, labelled as JSON
        ("application/json", b'"just a string"'),
        ("application/json", b""),
        ("application/json", b'[{"details": {"generated_tokens": 3}}, {"details": {}}]'),
        ("text/plain", b'{"details": {"generated_tokens": 3}}'),  # JSON, not labelled so
    ],
)
def test_a_body_that_is_not_a_json_object_is_relayed_and_not_read(
    content_type: str, body: bytes
) -> None:
    read, _, _ = reader(TgiStream(), content_type)
    read.chunk(10, body)
    assert read.close(True) == (False, 0)
    assert (read.dialect.output_tokens, read.dialect.malformed, read.failed) == (None, 0, False)


def test_a_json_body_over_the_bound_is_not_read() -> None:
    read, _, _ = reader(TgiStream(), "application/json")
    head = b'{"details": {"generated_tokens": 3}, "generated_text": "'
    read.chunk(10, head + b"x" * (MAX_JSON_BODY - len(head) - 2))
    read.chunk(20, b'"}')  # exactly the bound: still read
    read.close(True)
    assert read.dialect.output_tokens == 3
    over, _, _ = reader(TgiStream(), "application/json")
    over.chunk(10, head + b"x" * (MAX_JSON_BODY - len(head) - 1))
    over.chunk(20, b'"}')
    assert over.close(True) == (False, 0)
    assert over.dialect.output_tokens is None


def test_the_prefill_queue_is_left_at_the_first_output() -> None:
    read, _, counts = reader(OllamaStream(), NDJSON)
    read.wait()
    read.wait()  # once in the queue, whatever the caller
    assert (read.queued, counts.queued, counts.entered) == (True, 1, 1)
    read.chunk(10, line(response=""))  # an event, no output: still waiting
    assert counts.queued == 1
    read.chunk(20, line(response="a"))
    assert (read.queued, counts.queued) == (False, 0)
    read.leave(30, served=False)  # and the end leaves it only if still there
    assert counts.queued == 0
    ended, _, counts = reader(OpenAIStream(), SSE)
    ended.wait()
    ended.leave(40, served=False)
    assert (ended.queued, counts.queued, counts.entered) == (False, 0, 1)


def test_a_stream_departs_its_backlog_at_its_first_output_or_abandons_it() -> None:
    """A leg's wait: in no user's queue, in its backlog, served at its first output."""
    backlog = PrefillBacklog()
    read, _, counts = reader(OllamaStream(), NDJSON)
    backlog.enter(0, 120)
    read.wait(False, backlog, 120)
    assert (read.queued, counts.entered) == (True, 0)
    read.chunk(10, line(response="a"))
    assert backlog.waiting == 0 and backlog.read(10 + 10**9).busy_seconds == 10e-9
    assert backlog.alone.predict(1, 120) is not None  # served: a service seen
    gone, _, _ = reader(OllamaStream(), NDJSON)
    backlog.enter(20, 80)
    gone.wait(True, backlog, 80)
    gone.leave(50, served=False)  # its end, no output: abandoned, no service
    assert backlog.waiting == 0 and backlog.alone.samples == 1


def test_other_choices_are_timed_apart_from_choice_0() -> None:
    read, clock, _ = reader(OpenAIStream(), SSE)
    both = b"".join(
        b"data: " + json.dumps({"choices": [{"index": i, "delta": {"content": "x"}}]}).encode()
        + b"\n\n"
        for i in (0, 1, 1)
    )  # fmt: skip
    read.chunk(10, both)
    read.chunk(20, token(b"y"))
    assert read.dialect.pending == {}  # taken by the read that counted them
    assert timed(clock) == [(10, 2), (10, 2)]


def test_an_error_is_counted_and_logged_once_and_reading_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read, clock, counts = reader(Raising(), NDJSON)
    read.chunk(10, line(response="a"))
    with caplog.at_level(logging.ERROR, logger="llmobs.observer"):
        read.chunk(20, line(response="b"))  # the dialect raises: the reader does not
        read.fail("finish")
    assert read.failed
    assert counts.errors == 2  # each error counted
    assert [r.getMessage() for r in caplog.records] == [
        "observation failed in chunk; the relay continues"
    ]  # logged once
    read.chunk(30, line(response="c"))
    assert clock.tape.tolist() == [10]
    assert read.close(True) == (False, 0)  # nothing more read


def test_a_sink_that_cannot_count_an_error_breaks_nothing() -> None:
    read, _, counts = reader(Raising(), NDJSON, FakeCounts(broken=True))
    for t in (10, 20):
        read.chunk(t, line(response="a"))
    assert read.failed and counts.errors == 1


def test_the_dialect_can_be_chosen_again_before_the_body() -> None:
    """The request body may name another route's dialect (TGI's compat route)."""
    read, clock, _ = reader(OpenAIStream())
    read.use(OllamaStream())
    read.response(NDJSON)
    read.chunk(10, line(response="a"))
    assert isinstance(read.dialect, OllamaStream)
    assert clock.tape.tolist() == [10]


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
    """The chat dialect, keeping the events it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bytes] = []

    def on_data(self, data: bytes) -> int:
        self.calls.append(data)
        return super().on_data(data)


def observe(
    reads: list[bytes], whole: bool, max_line: int
) -> tuple[Any, dict[str, Any], tuple[int, int], str]:
    """A streaming chat request of ``reads``: its record, dialect and decoder state, series.
    ``whole`` False: the reference, with none of the shortcuts (neither the reader's nor the
    dialect's), so that a shortcut wrong in both places is still found."""
    sink, recorder = recording(None, 8)
    route = Route(CHAT, Kept if whole else Full, "openai")
    obs = Observer(recorder, ObserveSettings(max_line_bytes=max_line), route, 0)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(0)
    obs.response(200, SSE)
    for i, data in enumerate(reads):
        obs.chunk((i + 1) * 20_000_000, data)
    record = obs.finish(10**10, Outcome.OK)
    dialect = Kept.made[-1]
    # the decoder's own counts, which no record carries
    decoder = obs._reader._sse
    assert decoder is not None
    series = text.render(sink.collector.frames()).decode()
    return record, state(dialect), (decoder.malformed, decoder.comments), series


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


_HEAD, _TAIL = HEAD.removeprefix(b"data: "), TAIL.removesuffix(b"\n\n")  # the events, unframed
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
    dialect = Counted()
    read, clock, _ = reader(dialect, SSE)
    calls = dialect.calls
    words = [b"a", b" b", b"c", b'\\"q\\"', "é".encode(), b"d"]
    for i, word in enumerate(words):
        read.chunk(i + 1, token(word))
    assert len(calls) == 3  # the first (it makes the template), then escapes and non-ASCII
    coalesced = b"".join(token(w) for w in (b"e", b"f", b"g"))
    read.chunk(len(words) + 1, coalesced)  # three token events in one read: counted whole too
    assert len(calls) == 3
    assert timed(clock) == [(1, len(words) + 3)]


def test_a_request_forwarded_after_its_first_token_leaves_the_queue_on_the_next() -> None:
    """The fast path times a read and nothing else, so it must not be armed while the request
    waits in the prefill queue: ``wait`` disarms it, and should it come late (the proxy
    forwards before any response; a retry or another caller might not), the next token
    still takes the request out of the queue."""
    read, clock, counts = reader(OpenAIStream(), SSE)
    read.chunk(1, token(b"a"))  # the template: the fast path armed
    read.wait()
    assert counts.queued == 1
    read.chunk(3, token(b"b"))
    assert (counts.queued, clock.tape.tolist()) == (0, [1, 3])


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
    sink, recorder = recording(None, 8)
    obs = Observer(recorder, ObserveSettings(), OPENAI_CHAT, 0)
    obs.request_body(b'{"model": "m", "stream": true}')
    obs.forwarded(0)
    obs.response(200, SSE)
    window = StreamTimer(0).window
    chunks = window + window // 2
    read = token(b"w") * per_read
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
