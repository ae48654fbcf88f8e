"""The request timer (``timing.StreamTimer``, ``finish_request``, ``unparsed``): TTFT, TPOT and
duration from a start other than zero, chunks of two tokens, when a window is due, token
accounting across windows, the engine's usage spread over the chunks not yet taken, the stall
line carried from one window to the next, the defaults, and the pooled record of a request
with several choices.

Times are whole milliseconds whose gaps are binary fractions of a second (250 ms, 125 ms), so
most numbers are exact and compared with ``==``: a constant off by one part in a billion
(``1e9`` for ``1000000001.0``) would pass ``pytest.approx``."""

from __future__ import annotations

import pytest

from llmobs.observe import stats
from llmobs.observe.timing import (
    Outcome,
    RequestStats,
    StreamTimer,
    TokenSource,
    finish_request,
    unparsed,
)
from llmobs.observe.window import TokenWindow

MS = 1_000_000  # ns
# either way of computing a window: plain Python for small ones, numpy for every window
PATHS = pytest.mark.parametrize("small", [stats.SMALL, 0], ids=["python", "numpy"])


def feed(
    timer: StreamTimer, chunks: list[tuple[int, int]], total: int | None = None
) -> list[TokenWindow]:
    """Record ``chunks`` (time in ms, tokens), taking each window as it fills, then the last
    one with the engine's ``total``."""
    windows = []
    for t_ms, tokens in chunks:
        if timer.output(t_ms * MS, tokens):
            windows.append(timer.take_window())
    windows.append(timer.take_window(total_tokens=total))
    return windows


def pooled(
    timers: list[StreamTimer], end_ms: int, output_tokens: int | None = None
) -> RequestStats:
    """The record of a request whose choices ``timers`` timed, ended at ``end_ms``."""
    return finish_request(
        timers, end_ms * MS, operation="chat", model="m", outcome=Outcome.OK, status=200,
        stream=True, input_tokens=7, output_tokens=output_tokens,
    )  # fmt: skip


def record(timer: StreamTimer, end_ms: int, output_tokens: int | None = None) -> RequestStats:
    return pooled([timer], end_ms, output_tokens)


def ones(times_ms: list[int]) -> list[tuple[int, int]]:
    return [(t, 1) for t in times_ms]


def test_ttft_tpot_and_duration_are_measured_from_the_request_start() -> None:
    timer = StreamTimer(3_000 * MS)  # the request started 3 s into the clock, not at 0
    feed(timer, ones([3_250, 3_375, 3_500]))
    got = record(timer, 4_000)
    assert got.ttft_s == 0.25
    assert got.duration_s == 1.0
    assert got.tpot_s == 0.125  # 250 ms for the two tokens after the first
    assert stats.tpot(3_250 * MS, 3_500 * MS, 3) == 0.125


def test_a_request_without_output_lasts_from_its_start() -> None:
    got = record(StreamTimer(2_000 * MS), 2_500)
    assert got.duration_s == 0.5
    assert (got.ttft_s, got.tpot_s, got.output_tokens, got.chunks) == (None, None, 0, 0)


@PATHS
def test_a_chunk_of_two_tokens_counts_two(small: int) -> None:
    timer = StreamTimer(0, small=small)
    [window] = feed(timer, [(1_000, 2), (1_250, 1), (1_500, 2), (1_750, 1)])
    assert timer.tokens == 6 and timer.chunks == 4
    assert window.weights.tolist() == [1.0, 2.0, 1.0]
    assert window.itl.tolist() == [0.25, 0.125, 0.25]
    got = record(timer, 2_000)
    assert got.output_tokens == 6 and got.token_source is TokenSource.COUNTED
    assert got.itl_count == 4.0  # the first chunk's two tokens have no gap before them
    assert got.tpot_s == 0.75 / 5


@PATHS
def test_each_chunk_keeps_its_own_token_count(small: int) -> None:
    """Chunks of other than one token, at any place in the window, divide their own gap."""
    timer = StreamTimer(0, small=small)
    [window] = feed(timer, [(1_000, 1), (1_250, 2), (1_500, 1), (1_750, 4)])
    assert window.weights.tolist() == [2.0, 1.0, 4.0]
    assert window.itl.tolist() == [0.125, 0.25, 0.0625]
    assert window.tokens == 7.0 and window.itl_max == 0.25


def test_a_window_is_due_when_it_holds_window_gaps() -> None:
    """``output`` says True once the window holds ``window`` gaps: the first chunk and
    ``window`` more, then the previous window's last chunk (kept) and ``window`` more."""
    timer = StreamTimer(0, window=4)
    due = [timer.output(t * MS, 1) for t in range(1, 6)]
    assert due == [False, False, False, False, True] and (len(timer.times) > timer.window)
    assert timer.take_window().size == 4 and not (len(timer.times) > timer.window)
    assert len(timer.times) == 1  # the anchor
    due = [timer.output(t * MS, 1) for t in range(6, 10)]
    assert due == [False, False, False, True]


def test_a_window_is_65536_gaps_by_default() -> None:
    timer = StreamTimer(0)
    assert not any(timer.output(t, 1) for t in range(65536))
    assert timer.output(65536, 1) and (len(timer.times) > timer.window)


@PATHS
def test_the_first_chunks_tokens_are_counted_once_across_windows(small: int) -> None:
    """A first chunk of several tokens: every window after it counts only its own chunks."""
    timer = StreamTimer(0, window=4, small=small)
    chunks = [(1_000, 3), *ones([1_250, 1_500, 1_750, 2_000, 2_250, 2_500, 2_750, 3_000])]
    windows = feed(timer, [*chunks, (3_250, 2)])
    assert [w.tokens for w in windows] == [4.0, 4.0, 2.0]
    assert timer.tokens == 3 + 8 + 2
    got = record(timer, 4_000)
    assert (got.output_tokens, got.chunks, got.itl_count) == (13, 10, 10.0)


@PATHS
@pytest.mark.parametrize("before", [1, 2], ids=["one-window-before", "two-windows-before"])
def test_usage_is_spread_over_the_chunks_not_yet_taken(small: int, before: int) -> None:
    """The engine's total, less the tokens earlier windows counted (the first chunk's 3 and
    one per chunk after it), is spread over the last window's chunks."""
    timer = StreamTimer(0, window=4, small=small)
    taken = [(1_000, 3), *ones([1_000 + 250 * i for i in range(1, 4 * before + 1)])]
    t = taken[-1][0]
    windows = feed(timer, [*taken, (t + 250, 1), (t + 500, 1)], total=3 + 4 * before + 6)
    assert [w.tokens for w in windows] == [4.0] * before + [6.0]
    assert windows[-1].weights.tolist() == [3.0, 3.0]
    assert windows[-1].itl.tolist() == [0.25 / 3, 0.25 / 3]
    got = record(timer, 4_000, output_tokens=3 + 4 * before + 6)
    assert (got.output_tokens, got.token_source) == (3 + 4 * before + 6, TokenSource.USAGE)
    assert got.itl_count == 4 * before + 6


@PATHS
@pytest.mark.parametrize(
    ("times_ms", "total", "weights"),
    [
        ([1_000, 1_250], 3, [2.0]),  # two chunks, three tokens: the second carried two
        ([1_000, 1_250, 1_500], 4, [2.0, 1.0]),  # the odd token goes to the earlier chunk
        ([1_000, 1_250, 1_500], 5, [2.0, 2.0]),
        ([1_000, 1_250, 1_500], 3, [1.0, 1.0]),  # as counted: one a chunk
        ([1_000, 1_250, 1_500, 1_750], 2, [1.0, 1.0, 1.0]),  # too few: a chunk is a token
    ],
)
def test_usage_of_a_short_stream_is_spread_as_evenly_as_whole_tokens_allow(
    small: int, times_ms: list[int], total: int, weights: list[float]
) -> None:
    timer = StreamTimer(0, small=small)
    [window] = feed(timer, ones(times_ms), total=total)
    assert window.weights.tolist() == weights
    assert window.tokens == sum(weights)
    assert window.itl.tolist() == [0.25 / w for w in weights]


@PATHS
def test_a_short_last_window_is_judged_against_the_rhythm_before_it(small: int) -> None:
    """Two gaps are too few for a median of their own: the last window's stall line is
    3 x the median of the window before (250 ms), so its 750 ms pause is a stall."""
    timer = StreamTimer(0, window=4, small=small)
    windows = feed(timer, ones([1_000, 1_250, 1_500, 1_750, 2_000, 2_250, 3_000]))
    assert [w.stalls for w in windows] == [0, 1]
    assert windows[-1].median_gap == 0.25 and windows[-1].stall_threshold == 0.75
    assert record(timer, 4_000).stalls == 1


@PATHS
def test_stalls_and_itl_sums_add_up_over_windows(small: int) -> None:
    timer = StreamTimer(0, window=4, small=small)
    # each window: three gaps of 250 ms and a pause of 1 s (4 x the median: a stall)
    windows = feed(timer, ones([1_000, 1_250, 1_500, 1_750, 2_750, 3_000, 3_250, 3_500, 4_500]))
    assert [w.stalls for w in windows] == [1, 1, 0]
    got = record(timer, 5_000)
    assert got.stalls == 2
    assert (got.itl_count, got.itl_sum, got.itl_max) == (8.0, 3.5, 1.0)
    assert got.itl_sumsq == 2 * (3 * 0.0625 + 1.0)


def test_a_pause_of_three_times_the_median_is_a_stall_by_default() -> None:
    timer = StreamTimer(0)
    feed(timer, ones([1_000, 1_250, 1_500, 1_750, 2_500]))  # 250 ms gaps, then 750 ms
    assert record(timer, 3_000).stalls == 1


def test_a_pause_under_50_ms_is_no_stall_by_default() -> None:
    """10 ms gaps then a 50 ms pause (5 x the median): a stall; a 49 ms one is not."""
    for pause, stalls in ((50, 1), (49, 0)):
        timer = StreamTimer(0)
        feed(timer, ones([1_000, 1_010, 1_020, 1_030, 1_030 + pause]))
        assert record(timer, 3_000).stalls == stalls


def test_a_record_has_no_finish_reason_and_the_openai_dialect_unless_told() -> None:
    timer = StreamTimer(0)
    feed(timer, ones([1_000]))
    got = pooled([timer], 2_000)
    assert (got.finish_reason, got.dialect, got.finish_reasons) == ("none", "openai", ())


# Several choices (n > 1): one timer per choice, pooled into one record.


def choices() -> list[StreamTimer]:
    """Four choices of a request started at 1 s: choice 1 answers first (1.25 s)."""
    start = 1_000 * MS
    timers = [StreamTimer(start) for _ in range(4)]
    # choice 0: 5 tokens, 250 ms gaps then a 750 ms pause (a stall); 1.5 s of decoding
    feed(timers[0], ones([1_500, 1_750, 2_000, 2_250, 3_000]))
    feed(timers[1], ones([1_250, 2_250]))  # 2 tokens; 1 s for the second
    feed(timers[2], ones([1_375]))  # 1 token: nothing to decode after it
    feed(timers[3], [])  # no output
    return timers


def test_several_choices_are_pooled_into_one_record() -> None:
    got = pooled(choices(), 3_500, None)
    assert got.ttft_s == 0.25  # the first token of any choice
    assert got.duration_s == 2.5
    # the decode time of each choice over the tokens after its first: (1.5 + 1) / (4 + 1)
    assert got.tpot_s == 0.5
    assert (got.output_tokens, got.token_source, got.chunks) == (8, TokenSource.COUNTED, 8)
    assert (got.itl_count, got.itl_sum, got.itl_max, got.stalls) == (5.0, 2.5, 1.0, 1)
    assert got.itl_sumsq == 3 * 0.0625 + 0.5625 + 1.0
    assert got.smoothness == (2.5 * 2.5) / (5 * got.itl_sumsq)


def test_several_choices_take_the_engines_usage_when_it_has_one() -> None:
    got = pooled(choices(), 3_500, 11)
    assert (got.output_tokens, got.token_source) == (11, TokenSource.USAGE)
    assert got.tpot_s == 0.5  # timing comes from the chunks whatever the count


def test_choices_without_output_have_no_ttft_and_no_tpot() -> None:
    timers = [StreamTimer(0), StreamTimer(0)]
    got = pooled(timers, 1_000, None)
    assert (got.ttft_s, got.tpot_s, got.output_tokens, got.chunks) == (None, None, 0, 0)
    assert (got.itl_count, got.stalls, got.smoothness) == (0.0, 0, None)
    lone = [StreamTimer(0), StreamTimer(0)]  # one token each: nothing decoded after it
    feed(lone[0], ones([100]))
    feed(lone[1], ones([200]))
    got = pooled(lone, 1_000, None)
    assert (got.ttft_s, got.tpot_s, got.output_tokens) == (0.1, None, 2)


def test_an_unparsed_request_is_a_rejected_record_without_timing() -> None:
    assert unparsed(431, 0.5) == RequestStats(
        operation="other", model=None, outcome=Outcome.REJECTED, status=431, stream=False,
        duration_s=0.5, ttft_s=None, tpot_s=None, input_tokens=None, output_tokens=0,
        token_source=TokenSource.COUNTED, chunks=0, itl_count=0.0, itl_sum=0.0,
        itl_sumsq=0.0, itl_max=0.0, stalls=0, smoothness=None, response_model=None,
        response_id=None, finish_reasons=(), finish_reason="none", reasoning_tokens=None,
        reasoning_source=TokenSource.USAGE, cached_tokens=None, engine_prompt_eval_s=None,
        engine_load_s=None, dialect="none",
    )  # fmt: skip
