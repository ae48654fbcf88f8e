"""Each stall's cause (``observe.causes``), from literal schedules: the streams of one engine as
the relay saw them, its preemption counter's scrapes, the holds of a slow client."""

from __future__ import annotations

from array import array

import numpy as np

from llmobs.observe.causes import (
    EngineTimeline,
    Stall,
    StallCause,
    Trail,
    count_causes,
    stall_gaps,
)
from llmobs.observe.clock import OPEN, RequestClock
from llmobs.observe.stats import small_window, token_window

MS = 1_000_000
STEP = 20 * MS  # every stream's rhythm: a token each 20 ms
GAP = (1000 * MS, 1200 * MS)  # the stall judged: 200 ms without a chunk


def steady(start: int, end: int, skip: tuple[int, int] | None = None) -> list[int]:
    """A chunk every STEP from start to end, none strictly inside ``skip``."""
    return [t for t in range(start, end + 1, STEP) if skip is None or not skip[0] < t < skip[1]]


class Live:
    """A stream in flight, as the timeline sees one (``causes.Traced``)."""

    def __init__(self, trail: Trail) -> None:
        self._trail = trail

    def trail(self) -> Trail:
        return self._trail


def judge(*others: Trail, holds: tuple[tuple[int, int], ...] = (), ended: bool = False,
          timeline: EngineTimeline | None = None) -> StallCause:  # fmt: skip
    """The cause of GAP for a stream of rhythm STEP, with ``others`` in flight (or ended)."""
    timeline = timeline or EngineTimeline()
    for key, trail in enumerate(others, start=1):
        if ended:
            timeline.started(key, Live(trail))
            timeline.ended(key, 1500 * MS, trail)
        else:
            timeline.started(key, Live(trail))
    (cause,) = timeline.classify(0, [GAP], STEP / 1e9, holds)
    return cause


def test_a_stream_alone_pauses_with_its_engine() -> None:
    assert judge() is StallCause.ENGINE_PAUSE


def test_every_stream_paused_together_is_the_engine() -> None:
    others = [Trail(0, 10 * MS, steady(10 * MS, 2000 * MS, GAP)) for _ in range(3)]
    assert judge(*others) is StallCause.ENGINE_PAUSE
    assert judge(*others, ended=True) is StallCause.ENGINE_PAUSE


def test_a_chunk_in_the_edges_of_the_gap_is_the_steps_around_it() -> None:
    """Delivery jitter: another stream's chunks up to an eighth of the gap inside either end
    are the same engine steps as this stream's, not flow during the pause."""
    jitter = [*steady(0, 1000 * MS), 1024 * MS, 1176 * MS, *steady(1200 * MS, 2000 * MS)]
    assert judge(Trail(0, 0, jitter)) is StallCause.ENGINE_PAUSE
    flowing = [*steady(0, 1000 * MS), 1026 * MS, *steady(1200 * MS, 2000 * MS)]
    assert judge(Trail(0, 0, flowing)) is StallCause.UNKNOWN


def test_others_flowing_while_this_one_waited_is_unknown() -> None:
    assert judge(Trail(0, 0, steady(0, 2000 * MS))) is StallCause.UNKNOWN


def test_a_first_token_in_the_gap_is_a_prefill() -> None:
    paused = Trail(0, 10 * MS, steady(10 * MS, 2000 * MS, GAP))
    # forwarded before the gap and queued, or early in it: its prefill can have taken the gap
    for forwarded in (500 * MS, 1050 * MS, None):
        newcomer = Trail(forwarded, 1203 * MS, steady(1203 * MS, 1600 * MS))
        assert judge(paused, newcomer) is StallCause.PREFILL
        assert judge(paused, newcomer, ended=True) is StallCause.PREFILL
    # it reached the engine late in the gap: its prefill cannot explain the gap
    late = Trail(1150 * MS, 1203 * MS, steady(1203 * MS, 1600 * MS))
    assert judge(paused, late) is StallCause.ENGINE_PAUSE
    # a first token past the gap's end by more than an eighth of it: a later step
    after = Trail(900 * MS, 1230 * MS, steady(1230 * MS, 1600 * MS))
    assert judge(paused, after) is StallCause.ENGINE_PAUSE
    # nor is one at its start (the step before the gap)
    before = Trail(900 * MS, 1010 * MS, [1010 * MS])
    assert judge(paused, before) is StallCause.ENGINE_PAUSE


def preempted_at(*spans: tuple[int, int]) -> EngineTimeline:
    """A timeline whose preemption counter rose once in each (scrape, next scrape)."""
    timeline = EngineTimeline()
    total = 0.0
    timeline.preemptions(0, 1 * MS, total)
    for sent, read in spans:
        timeline.preemptions(sent, sent + MS, total)
        total += 1.0
        timeline.preemptions(read - MS, read, total)
    return timeline


RESUMED = Trail(0, 0, [*steady(0, 600 * MS), *steady(1200 * MS, 2000 * MS)])


def test_a_stream_recomputed_after_a_preemption_is_a_prefill() -> None:
    """A preempted request's recompute shows no first token: it resumes in the gap after a
    silence that began before the gap did, in which the engine counted a preemption."""
    assert judge(RESUMED, timeline=preempted_at((590 * MS, 700 * MS))) is StallCause.PREFILL
    # no preemption in its silence: it was held up as this one was (the engine paused)
    assert judge(RESUMED) is StallCause.ENGINE_PAUSE
    # a silence that began with this gap (the same step, jitter aside): paused with it
    together = Trail(0, 0, [*steady(0, 980 * MS), 995 * MS, *steady(1195 * MS, 2000 * MS)])
    assert judge(together, timeline=preempted_at((590 * MS, 700 * MS))) is (
        StallCause.ENGINE_PAUSE)  # fmt: skip
    # a stream its own client held resumes whenever its client reads: no prefill
    held = Trail(0, 0, RESUMED.times, ((610 * MS, 1190 * MS),))
    assert judge(held, timeline=preempted_at((590 * MS, 700 * MS))) is StallCause.ENGINE_PAUSE


def test_a_preemption_counted_in_the_gap_while_others_went_on() -> None:
    flowing = Trail(0, 0, steady(0, 2000 * MS))
    assert judge(flowing, timeline=preempted_at((900 * MS, 1105 * MS))) is StallCause.PREEMPTION
    # every stream stopped with it, no prefill: the engine paused, whatever was preempted
    paused = Trail(0, 0, steady(0, 2000 * MS, GAP))
    assert judge(paused, timeline=preempted_at((900 * MS, 1105 * MS))) is (
        StallCause.ENGINE_PAUSE)  # fmt: skip


def test_a_stream_recomputed_in_a_prefill_was_preempted() -> None:
    """It resumed with a prefill's first token (within half its rhythm): it was in that
    prefill; one step later, it only waited for it."""
    newcomer = Trail(500 * MS, 1195 * MS, [1195 * MS])
    timeline = preempted_at((900 * MS, 1105 * MS))
    assert judge(newcomer, timeline=timeline) is StallCause.PREEMPTION
    waited = Trail(500 * MS, 1180 * MS, [1180 * MS])
    assert judge(waited, timeline=preempted_at((900 * MS, 1105 * MS))) is StallCause.PREFILL
    assert judge(newcomer) is StallCause.PREFILL  # no preemption counted


def test_a_preemption_outside_the_gap_is_not_its_cause() -> None:
    flowing = Trail(0, 0, steady(0, 2000 * MS))
    timeline = preempted_at((400 * MS, 505 * MS), (1300 * MS, 1400 * MS))
    timeline.preemptions(1500 * MS, 1505 * MS, 0.0)  # an engine restart: no rise
    timeline.preemptions(1600 * MS, 1605 * MS, 0.0)
    assert judge(flowing, timeline=timeline) is StallCause.UNKNOWN


def test_a_client_that_held_the_stream_for_half_the_gap_is_the_cause() -> None:
    flowing = Trail(0, 0, steady(0, 2000 * MS))
    holds = ((1090 * MS, OPEN),)  # held from 1090 ms on: 110 of 200 ms
    timeline = preempted_at((900 * MS, 1105 * MS))
    assert judge(flowing, holds=holds, timeline=timeline) is StallCause.CLIENT
    short = ((900 * MS, 1050 * MS), (1150 * MS, 1190 * MS))  # 50 + 40 ms: under half
    assert judge(flowing, holds=short, timeline=timeline) is StallCause.PREEMPTION


def test_ended_streams_are_kept_a_while_and_so_many() -> None:
    timeline = EngineTimeline(keep_s=1.0, keep=2)
    flowing = Trail(0, 0, steady(0, 1400 * MS))
    timeline.started(1, Live(flowing))
    timeline.ended(1, 1400 * MS, flowing)
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.UNKNOWN]
    assert timeline.classify(1, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]  # not its own
    for key in (2, 3):  # two more: the first goes
        timeline.ended(key, 1500 * MS, Trail(0, 0, [0]))
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]
    timeline = EngineTimeline(times=len(flowing.times) + 1)
    timeline.ended(1, 1400 * MS, flowing)
    timeline.ended(2, 1500 * MS, Trail(0, 0, [0, 1]))  # past the times kept: the first goes
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]
    timeline = EngineTimeline(keep_s=1.0)
    timeline.ended(1, 1400 * MS, flowing)
    timeline.ended(2, 2500 * MS, None)  # more than a second later: the first goes
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]


def test_streams_that_ended_before_the_gap_are_not_read() -> None:
    timeline = EngineTimeline()
    timeline.ended(1, 900 * MS, Trail(0, 0, steady(0, 1400 * MS)))  # (its times say later)
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]


def test_a_request_is_not_its_own_evidence() -> None:
    timeline = EngineTimeline()
    timeline.started(0, Live(Trail(0, 0, steady(0, 2000 * MS))))
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]
    timeline.ended(0, 2000 * MS, None)
    assert timeline.classify(5, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]  # gone


def test_numpy_times_as_a_long_window_holds_them() -> None:
    flowing = Trail(0, 0, np.array(steady(0, 2000 * MS), dtype=np.int64))
    assert judge(flowing) is StallCause.UNKNOWN
    resumed = Trail(0, 0, np.array(RESUMED.times, dtype=np.int64))
    assert judge(resumed, timeline=preempted_at((590 * MS, 700 * MS))) is StallCause.PREFILL


def test_the_gaps_of_a_windows_stalls() -> None:
    times = [*steady(0, 1000 * MS), *steady(1200 * MS, 1600 * MS), 1900 * MS]
    small = small_window(times, None, factor=3.0, min_gap=0.05)
    big = token_window(np.array(times, dtype=np.int64), None, factor=3.0, min_gap=0.05)
    for window in (small, big):
        assert window.stalls == 2
        assert stall_gaps(window) == [(1000 * MS, 1200 * MS), (1600 * MS, 1900 * MS)]
    steady_window = small_window(steady(0, 1000 * MS), None, factor=3.0, min_gap=0.05)
    assert stall_gaps(steady_window) == []


def test_stalls_by_cause_and_those_past_the_judged_as_unknown() -> None:
    stalls = [Stall(0, 1, StallCause.PREFILL), Stall(2, 3, StallCause.CLIENT),
              Stall(4, 5, StallCause.PREFILL)]  # fmt: skip
    assert count_causes(3, stalls) == [(StallCause.PREFILL, 2), (StallCause.CLIENT, 1)]
    assert count_causes(5, stalls) == [
        (StallCause.PREFILL, 2), (StallCause.CLIENT, 1), (StallCause.UNKNOWN, 2)]  # fmt: skip
    assert count_causes(0, []) == []
    assert Stall(1000 * MS, 1250 * MS, StallCause.CLIENT).gap_s == 0.25


def test_the_clock_holds_and_its_trail() -> None:
    clock = RequestClock(0, lambda window: None)
    clock.forwarded_ns = 2 * MS
    assert clock.trail() == Trail(2 * MS, None, array("Q"), [])
    clock.held(50 * MS)
    clock.released(80 * MS)
    clock.released(90 * MS)  # no hold open: nothing
    clock.held(100 * MS)
    for t in (10, 30, 50):
        clock.output(t * MS, 1)
    trail = clock.trail()
    assert trail.first_ns == 10 * MS and list(trail.times) == [10 * MS, 30 * MS, 50 * MS]
    assert trail.holds == [(50 * MS, 80 * MS), (100 * MS, OPEN)]
    kept = clock.trail(2)  # a copy of the latest two: the tape goes on
    clock.output(70 * MS, 1)
    assert list(kept.times) == [30 * MS, 50 * MS]
    assert list(clock.trail().times) == [10 * MS, 30 * MS, 50 * MS, 70 * MS]


def test_a_clock_keeps_its_latest_holds() -> None:
    """64 holds at most: the 65th drops the oldest half."""
    clock = RequestClock(0, lambda window: None)
    for i in range(64):
        clock.held(i * 10)
        clock.released(i * 10 + 5)
    assert len(clock.holds) == 64 and clock.holds[0] == (0, 5)
    clock.held(640)
    assert len(clock.holds) == 33
    assert clock.holds[0] == (320, 325) and clock.holds[-1] == (640, OPEN)


# -- the rules at their edges (each line below is a boundary a wrong number would cross) ------

S, E = GAP  # the gap judged: 1000 to 1200 ms, its edges an eighth (25 ms), its half 100 ms
SILENCE = S - 25 * MS  # before this, another stream's silence began before the gap
FLOWING = Trail(0, 0, [*steady(0, 980 * MS), 990 * MS, 1100 * MS, 1190 * MS, 1300 * MS])


def cause_of(
    *others: Trail,
    median: float | None = STEP / 1e9,
    holds: tuple[tuple[int, int], ...] = (),
    timeline: EngineTimeline | None = None,
) -> StallCause:
    timeline = timeline or EngineTimeline()
    for key, trail in enumerate(others, start=1):
        timeline.started(key, Live(trail))
    (cause,) = timeline.classify(0, [GAP], median, holds)
    return cause


def test_a_client_hold_of_exactly_half_the_gap_and_holds_add_up() -> None:
    assert cause_of(holds=((S, S + 100 * MS),)) is StallCause.CLIENT
    assert cause_of(holds=((S, S + 100 * MS - 1),)) is StallCause.ENGINE_PAUSE
    # two holds of 60 and 50 ms: 110 ms held
    assert cause_of(holds=((S, S + 60 * MS), (1100 * MS, 1150 * MS))) is StallCause.CLIENT
    # a hold outside the gap adds nothing
    outside = ((S, S + 100 * MS - 1), (2000 * MS, 2100 * MS))
    assert cause_of(holds=outside) is StallCause.ENGINE_PAUSE


def test_flow_is_a_chunk_strictly_inside_after_one_since_the_silence() -> None:
    assert cause_of(FLOWING) is StallCause.UNKNOWN
    # just inside the edges: the last 25 ms before the end is the next step's
    at_edge = Trail(0, 0, [990 * MS, E - 25 * MS, 1300 * MS])
    assert cause_of(at_edge) is StallCause.ENGINE_PAUSE
    assert cause_of(Trail(0, 0, [990 * MS, E - 25 * MS - 1, 1300 * MS])) is StallCause.UNKNOWN
    # the chunk before it at the silence's start exactly still flowed; one before, not
    assert cause_of(Trail(0, 0, [SILENCE, 1100 * MS])) is StallCause.UNKNOWN
    assert cause_of(Trail(0, 0, [SILENCE - 1, 1100 * MS, 1300 * MS])) is StallCause.ENGINE_PAUSE
    # its second chunk: the first in the gap came after a silence, the next one flowed
    assert cause_of(Trail(0, 0, [600 * MS, 1100 * MS, 1120 * MS, 1300 * MS])) is StallCause.UNKNOWN
    assert cause_of(Trail(0, 0, [500 * MS, 990 * MS, 1100 * MS])) is StallCause.UNKNOWN
    # a first chunk inside the gap is no flow (a first token, its request late to the engine)
    assert cause_of(Trail(1150 * MS, 1100 * MS, [1100 * MS])) is StallCause.ENGINE_PAUSE


def test_a_long_windows_times_are_searched_the_same() -> None:
    edge = np.array([S - 5 * MS, S + 25 * MS, E + 5 * MS], dtype=np.int64)  # at the edge exactly
    assert cause_of(Trail(0, 0, edge)) is StallCause.ENGINE_PAUSE
    inside = np.array([S - 5 * MS, S + 26 * MS, E + 5 * MS], dtype=np.int64)
    assert cause_of(Trail(0, 0, inside)) is StallCause.UNKNOWN


def test_a_first_token_that_can_have_taken_half_the_gap() -> None:
    # it reached the engine at the gap's start + 100 ms: its prefill took at most half
    half = Trail(S + 100 * MS, E - 1, [E - 1])
    assert cause_of(half) is StallCause.ENGINE_PAUSE  # 100 ms - 1 ns: under half
    assert cause_of(Trail(S + 100 * MS - 1, E - 1, [E - 1])) is StallCause.PREFILL
    assert cause_of(Trail(S + 100 * MS, E, [E])) is StallCause.PREFILL  # exactly half
    assert cause_of(Trail(S, E, [E])) is StallCause.PREFILL  # reached it as the gap began
    # the latest first token of a prefill in the gap: an eighth of the gap after it
    assert cause_of(Trail(500 * MS, E + 25 * MS, [E + 25 * MS])) is StallCause.PREFILL
    assert cause_of(Trail(500 * MS, E + 25 * MS + 1, [E + 25 * MS + 1])) is (
        StallCause.ENGINE_PAUSE)  # fmt: skip


def test_a_recompute_that_can_have_taken_half_the_gap() -> None:
    preempted = preempted_at((700 * MS, 800 * MS))  # in the silence, not in the gap
    # resumed just in time, or at the latest step (an eighth after the gap)
    for after in (S + 100 * MS, E + 25 * MS):
        resumed = Trail(0, 0, [600 * MS, after, 1400 * MS])
        assert cause_of(resumed, timeline=preempted_at((700 * MS, 800 * MS))) is (
            StallCause.PREFILL)  # fmt: skip
    for after in (S + 100 * MS - 1, S + 60 * MS, E + 25 * MS + 1):
        resumed = Trail(0, 0, [600 * MS, after, 1400 * MS])
        assert cause_of(resumed, timeline=preempted_at((700 * MS, 800 * MS))) is (
            StallCause.ENGINE_PAUSE)  # fmt: skip
    # its silence began at the silence's start exactly: paused with this one
    assert cause_of(Trail(0, 0, [SILENCE, E]), timeline=preempted) is StallCause.ENGINE_PAUSE
    assert cause_of(Trail(0, 0, [SILENCE - 1, E]), timeline=preempted_at((980 * MS, 990 * MS))) is (
        StallCause.PREFILL)  # fmt: skip
    # its only chunk before the gap, the one it resumed after: read as the one before
    assert cause_of(Trail(0, 0, [600 * MS, E]), timeline=preempted_at((700 * MS, 800 * MS))) is (
        StallCause.PREFILL)  # fmt: skip


def test_the_stream_rhythm_sets_the_silence() -> None:
    """A stream of 100 ms steps: another's silence must have begun half a step before the
    gap (50 ms), not just an edge (25 ms); none known: the edge alone."""
    rise = preempted_at((S - 45 * MS, S - 20 * MS))  # counted before the gap, after 960 ms
    resumed = Trail(0, 0, [S - 40 * MS, E])
    assert cause_of(resumed, median=0.1, timeline=rise) is StallCause.ENGINE_PAUSE
    assert cause_of(resumed, median=None, timeline=preempted_at((S - 45 * MS, S - 20 * MS))) is (
        StallCause.PREFILL)  # fmt: skip
    # a rhythm of 3 s: a silence from 1.5 s before the gap, to the nanosecond
    long = Trail(0, 0, [S - 1_500_000_001, E])
    early = preempted_at((S - 1_400_000_000, S - 1 * MS))
    assert cause_of(long, median=3.0, timeline=early) is StallCause.PREFILL
    late = Trail(0, 0, [S - 1_500_000_000, E])
    assert cause_of(late, median=3.0, timeline=preempted_at((S - 1_400_000_000, S - MS))) is (
        StallCause.ENGINE_PAUSE)  # fmt: skip


def test_recomputed_is_within_half_a_step_of_a_first_token() -> None:
    rise = (900 * MS, 1105 * MS)
    for first, cause in ((E - 9 * MS, StallCause.PREEMPTION), (E + 8 * MS, StallCause.PREEMPTION),
                         (E - 10 * MS, StallCause.PREFILL)):  # fmt: skip
        assert cause_of(Trail(500 * MS, first, [first]), timeline=preempted_at(rise)) is cause
    # an odd rhythm: half a step rounds down
    odd = Trail(500 * MS, E - 10 * MS, [E - 10 * MS])
    assert cause_of(odd, median=0.020000001, timeline=preempted_at(rise)) is StallCause.PREFILL


def test_a_preempted_stream_waits_for_flow_before_it_is_called_so() -> None:
    """A prefill in the gap of a stream the engine preempted: while no other stream is seen
    to flow it may be a prefill; one that flowed makes it the preemption."""
    newcomer = Trail(500 * MS, E - 50 * MS, [E - 50 * MS])
    assert cause_of(newcomer, FLOWING, timeline=preempted_at((900 * MS, 1105 * MS))) is (
        StallCause.PREEMPTION)  # fmt: skip
    assert cause_of(newcomer, timeline=preempted_at((900 * MS, 1105 * MS))) is StallCause.PREFILL


def test_the_counter_rose_in_an_interval_that_overlaps_the_gap() -> None:
    def timeline(*samples: tuple[int, int, float]) -> EngineTimeline:
        found = EngineTimeline()
        for sample in samples:
            found.preemptions(*sample)
        return found

    # asked before the gap's end, read after it: the rise may be in the gap
    rose = timeline((1150 * MS, 1250 * MS, 0.0), (1300 * MS, 1305 * MS, 1.0))
    assert cause_of(FLOWING, timeline=rose) is StallCause.PREEMPTION
    # asked at its end exactly: after it
    after = timeline((E, E + MS, 0.0), (1300 * MS, 1301 * MS, 1.0))
    assert cause_of(FLOWING, timeline=after) is StallCause.UNKNOWN
    # read at its start exactly: before it
    before = timeline((900 * MS, 901 * MS, 0.0), (990 * MS, S, 1.0))
    assert cause_of(FLOWING, timeline=before) is StallCause.UNKNOWN


def test_the_samples_kept_are_the_latest_512() -> None:
    def rise_then(count: int) -> EngineTimeline:
        found = EngineTimeline()
        found.preemptions(900 * MS, 901 * MS, 0.0)
        found.preemptions(1100 * MS, 1101 * MS, 1.0)
        for i in range(count):
            found.preemptions(2000 * MS + i, 2000 * MS + i, 1.0)
        return found

    assert cause_of(FLOWING, timeline=rise_then(510)) is StallCause.PREEMPTION  # 512 in all
    assert cause_of(FLOWING, timeline=rise_then(511)) is StallCause.UNKNOWN  # the first goes


def test_ended_streams_two_minutes_2048_and_a_million_times() -> None:
    def flowing_then(*ends: tuple[int, Trail], **limits: int) -> StallCause:
        timeline = EngineTimeline(**limits)
        timeline.ended(1, 1500 * MS, FLOWING)
        for key, (end, trail) in enumerate(ends, start=2):
            timeline.ended(key, end, trail)
        (cause,) = timeline.classify(0, [GAP], 0.02)
        return cause

    nothing = Trail(0, 0, [0])
    minutes = 1500 * MS + 120_000 * MS
    assert flowing_then((minutes, nothing)) is StallCause.UNKNOWN  # kept two minutes
    assert flowing_then((minutes + 1, nothing)) is StallCause.ENGINE_PAUSE
    many = [(1500 * MS, nothing)] * 2047
    assert flowing_then(*many) is StallCause.UNKNOWN  # 2048 kept
    assert flowing_then(*many, (1500 * MS, nothing)) is StallCause.ENGINE_PAUSE
    # the times kept: at most the budget, counted out as streams go
    assert flowing_then(times=len(FLOWING.times)) is StallCause.UNKNOWN
    big = Trail(0, 0, [0] * 7)
    timeline = EngineTimeline(times=len(FLOWING.times) + 7)
    timeline.ended(1, 1500 * MS, big)
    timeline.ended(2, 1500 * MS, FLOWING)
    timeline.ended(3, 1500 * MS, Trail(0, 0, [0] * 7))  # the first goes: the rest fit
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.UNKNOWN]
    timeline.ended(4, 1500 * MS, Trail(0, 0, [0]))  # one time more than fits: the next goes
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.ENGINE_PAUSE]
    # a stream that ended at the gap's start exactly may have had a chunk in it
    timeline = EngineTimeline()
    timeline.ended(1, S, FLOWING)
    assert timeline.classify(0, [GAP], 0.02) == [StallCause.UNKNOWN]


def test_the_gaps_of_a_window_at_its_threshold_and_without_one() -> None:
    times = [*steady(0, 400 * MS), 460 * MS, *steady(480 * MS, 800 * MS)]  # a gap of 3 steps
    window = small_window(times, None, factor=3.0, min_gap=0.05)
    assert window.stall_threshold == 0.06 and window.stalls == 1
    assert stall_gaps(window) == [(400 * MS, 460 * MS)]
    no_line = window._replace(stall_threshold=None)
    assert stall_gaps(no_line) == []
    no_times = window._replace(chunk_times=None)
    assert stall_gaps(no_times) == []


def test_stalls_past_those_judged_add_to_the_unknown_ones() -> None:
    judged = [Stall(0, 1, StallCause.UNKNOWN), Stall(2, 3, StallCause.CLIENT)]
    assert count_causes(3, judged) == [(StallCause.CLIENT, 1), (StallCause.UNKNOWN, 2)]
    assert count_causes(4, judged) == [(StallCause.CLIENT, 1), (StallCause.UNKNOWN, 3)]
