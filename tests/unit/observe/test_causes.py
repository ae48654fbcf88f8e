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
    clock = RequestClock(0, lambda window: None)
    for i in range(100):
        clock.held(i * 10)
        clock.released(i * 10 + 5)
    assert len(clock.holds) <= 64
    assert clock.holds[-1] == (990, 995)
