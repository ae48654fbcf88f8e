"""The request clock (``clock.RequestClock``): choice 0's chunks through ``output`` or its tape,
other choices' through ``choices``, a timer per choice (those past ``MAX_CHOICES`` pooled into
the last), each full window handed on as it fills, the phases of a trace, the timers and last
windows at the end, and the record of a request whose observation broke.

Times are whole milliseconds, gaps binary fractions of a second: numbers compared exactly."""

from __future__ import annotations

from llmobs.observe.clock import MAX_CHOICES, RequestClock
from llmobs.observe.timing import Outcome, RequestStats, StreamTimer, finish_request
from llmobs.observe.window import TokenWindow

MS = 1_000_000  # ns


class Windows(list[TokenWindow]):
    """``on_window``: keeps each window handed on."""

    def __call__(self, window: TokenWindow) -> None:
        self.append(window)


def record(timers: list[StreamTimer], end_ms: int) -> RequestStats:
    return finish_request(
        timers, end_ms * MS, operation="chat", model="m", outcome=Outcome.OK, status=200,
        stream=True, input_tokens=None, output_tokens=None,
    )  # fmt: skip


def test_one_choice_is_timed_by_output_or_its_tape() -> None:
    windows = Windows()
    clock = RequestClock(1_000 * MS, windows)
    assert clock.output(1_250 * MS, 1) is False
    clock.tape.append(1_500 * MS)  # the reader's usual read: choice 0, one token
    assert clock.output(1_750 * MS, 2) is False
    timers, last = clock.close(None)
    assert len(timers) == 1 and len(last) == 1 and not windows
    assert (timers[0].tokens, timers[0].chunks) == (4, 3)
    assert last[0].weights.tolist() == [1.0, 2.0] and last[0].itl.tolist() == [0.25, 0.125]
    got = record(timers, 2_000)
    assert (got.ttft_s, got.duration_s, got.output_tokens) == (0.25, 1.0, 4)


def test_a_full_window_is_handed_on_and_the_tape_stays_the_same() -> None:
    windows = Windows()
    clock = RequestClock(0, windows)
    tape = clock.tape
    assert clock.limit == 65536
    for t in range(clock.limit):
        tape.append(t)
    assert clock.output(clock.limit, 1)  # the tape passes its limit: ``full`` is due
    clock.full()
    assert [w.size for w in windows] == [clock.limit]
    assert clock.tape is tape and len(tape) == 1  # the last chunk, kept as the anchor
    clock.output(clock.limit + 1, 1)
    _, last = clock.close(None)
    assert [w.size for w in last] == [1]


def test_the_engines_total_is_spread_over_one_choice() -> None:
    clock = RequestClock(0, Windows())
    for t in (1_000, 1_250, 1_500):
        clock.output(t * MS, 1)
    _, [last] = clock.close(7)  # 1 for the first chunk, 6 over the two after it
    assert last.weights.tolist() == [3.0, 3.0]


def test_a_read_of_several_choices_gives_each_its_tokens() -> None:
    clock = RequestClock(1_000 * MS, Windows())
    clock.choices(1_250 * MS, 5, {1: 2, 2: 1})  # 2 for choice 1, 1 for choice 2, 2 for 0
    clock.choices(1_500 * MS, 3, {2: 3})  # all of it choice 2's
    clock.output(1_750 * MS, 1)
    timers, last = clock.close(40)  # several choices: the engine's total is not spread
    assert [t.tokens for t in timers] == [3, 2, 4]  # choice 0 first, then as they came
    assert [t.chunks for t in timers] == [2, 1, 2]
    assert [w.weights.tolist() for w in last] == [[1.0], [], [3.0]]
    assert all(t.start_ns == 1_000 * MS for t in timers)
    got = record(timers, 2_000)
    assert (got.ttft_s, got.output_tokens, got.chunks) == (0.25, 9, 5)


def test_choices_past_the_last_are_pooled_into_it() -> None:
    clock = RequestClock(0, Windows())
    clock.choices(1_000 * MS, 3, {MAX_CHOICES - 1: 1, MAX_CHOICES: 1, MAX_CHOICES + 7: 1})
    timers, _ = clock.close(None)
    assert [t.tokens for t in timers] == [0, 1, 2]


def stalls(clock: RequestClock, gaps_ms: list[int]) -> list[int]:
    """Choices 0 and 1 each stream ``gaps_ms`` after 1 s: the stalls of their last windows."""
    t = 1_000
    clock.choices(t * MS, 2, {1: 1})
    for gap in gaps_ms:
        t += gap
        clock.choices(t * MS, 2, {1: 1})
    _, last = clock.close(None)
    return [w.stalls for w in last]


def test_every_choice_is_judged_with_the_clocks_stall_rule() -> None:
    """250 ms gaps, then a pause of 500 ms: a stall at twice the median (the clock's factor);
    10 ms gaps, then a pause of 40 ms: a stall with no minimum pause."""
    assert stalls(RequestClock(0, Windows(), factor=2.0), [250] * 3 + [500]) == [1, 1]
    assert stalls(RequestClock(0, Windows(), min_gap=0.0), [10] * 3 + [40]) == [1, 1]


def test_a_clock_judges_stalls_at_three_times_the_median_and_50_ms_by_default() -> None:
    assert stalls(RequestClock(0, Windows()), [250] * 3 + [750]) == [1, 1]
    assert stalls(RequestClock(0, Windows()), [250] * 3 + [749]) == [0, 0]
    assert stalls(RequestClock(0, Windows()), [10] * 3 + [50]) == [1, 1]
    assert stalls(RequestClock(0, Windows()), [10] * 3 + [49]) == [0, 0]


def test_a_full_window_of_another_choice_is_handed_on() -> None:
    windows = Windows()
    clock = RequestClock(0, windows)
    limit = StreamTimer(0).window
    for t in range(limit):
        clock.choices(t, 1, {3: 1})
    assert not windows
    clock.choices(limit, 2, {3: 1})  # one for choice 3, one for choice 0
    assert [w.size for w in windows] == [limit]
    timers, _ = clock.close(None)
    assert [t.tokens for t in timers] == [1, limit + 1]


def test_phases_are_forwarded_first_and_last_output_of_any_choice_and_end() -> None:
    clock = RequestClock(0, Windows())
    assert clock.phases(9) == (None, None, None, 9)
    clock.forwarded_ns = 5
    clock.choices(30, 2, {1: 1})
    clock.choices(20, 1, {2: 1})  # choice 2 began before the others
    clock.choices(70, 1, {1: 1})
    clock.output(50, 1)
    assert clock.phases(99) == (5, 20, 70, 99)


def test_a_broken_observation_is_counted_from_choice_0_as_far_as_it_went() -> None:
    """``counted``: no last window is taken; the chunks, TTFT and duration are there, the
    ITLs only of windows already taken (none here)."""
    clock = RequestClock(1_000 * MS, Windows())
    for t in (1_250, 1_500, 1_750):
        clock.output(t * MS, 1)
    got = clock.counted(
        2_000 * MS, operation="chat", model="m", outcome=Outcome.UPSTREAM_ERROR, status=200,
        stream=False, input_tokens=None, output_tokens=None,
    )  # fmt: skip
    assert (got.outcome, got.ttft_s, got.duration_s, got.chunks) == (
        Outcome.UPSTREAM_ERROR, 0.25, 1.0, 3,
    )  # fmt: skip
    assert (got.output_tokens, got.itl_count) == (3, 0.0)
    assert len(clock.tape) == 3  # nothing was taken


def test_ttft_phases_start_at_arrival_and_split_at_forwarding() -> None:
    """Before the engine: arrival (the clock's start) to forwarding; the engine's phases as
    the record has them; the rest is other. With several choices, TTFT is the first token of
    any of them. No first token: no phases."""
    clock = RequestClock(1_000 * MS, Windows())
    assert clock.ttft_phases(record([StreamTimer(0)], 0)) is None
    clock.forwarded_ns = 1_004 * MS
    clock.choices(1_300 * MS, 1, {1: 1})  # choice 1's first token, before choice 0's
    clock.output(1_350 * MS, 1)
    timers, _ = clock.close(None)
    stats = record(timers, 1_400)._replace(
        engine_queue_s=0.25, engine_prompt_eval_s=0.03125, engine_load_s=0.0078125
    )
    phases = clock.ttft_phases(stats)
    assert phases is not None
    assert tuple(phases) == (4 * MS, 7_812_500, 250 * MS, 31_250_000, 6_937_500, None, None, None)
    alone = RequestClock(1_000 * MS, Windows())  # never forwarded (a test's observer)
    alone.output(1_100 * MS, 1)
    only = alone.ttft_phases(record([StreamTimer(0)], 0))
    assert only is not None and tuple(only) == (0, None, None, None, 100 * MS, None, None, None)
