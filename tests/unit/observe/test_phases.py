"""A request's TTFT in phases (``observe.phases``): they sum to TTFT to the nanosecond, an
engine's report is taken as it is but never past what is left, and what is not reported is
``other``, not a guess."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmobs.observe.phases import Phase, TtftPhases, split_ttft
from tests.support.strategies import FAST

MS = 1_000_000


def test_the_engines_phases_and_the_rest() -> None:
    phases = split_ttft(300 * MS, 5 * MS, None, 0.2, 0.08)
    assert phases == TtftPhases(5 * MS, None, 200 * MS, 80 * MS, 15 * MS)
    assert phases.present() == [
        (Phase.BEFORE_ENGINE, 5 * MS), (Phase.QUEUE, 200 * MS), (Phase.PREFILL, 80 * MS),
        (Phase.OTHER, 15 * MS),
    ]  # fmt: skip
    assert phases.reported == (Phase.QUEUE, Phase.PREFILL)
    assert sum(ns for _, ns in phases.present()) == 300 * MS


def test_the_largest_phase_is_where_a_miss_is_counted() -> None:
    """The phase that took most of TTFT; of equals, the first in the order they happen."""
    assert TtftPhases(5 * MS, None, 200 * MS, 80 * MS, 15 * MS).largest() is Phase.QUEUE
    assert TtftPhases(5 * MS, 300 * MS, 10 * MS, 400 * MS, 0).largest() is Phase.PREFILL
    assert TtftPhases(9 * MS, None, None, None, 8 * MS).largest() is Phase.BEFORE_ENGINE
    assert TtftPhases(1, 0, 0, 0, 2).largest() is Phase.OTHER
    assert TtftPhases(0, 7, 7, 7, 7).largest() is Phase.LOAD  # equals: the first
    assert TtftPhases(0, None, None, None, 0).largest() is Phase.BEFORE_ENGINE
    assert TtftPhases(0, None, None, None, 1).largest() is Phase.OTHER


def test_an_engine_that_reports_nothing_leaves_its_time_in_other() -> None:
    phases = split_ttft(250 * MS, 3 * MS)
    assert phases == TtftPhases(3 * MS, None, None, None, 247 * MS)
    assert phases.reported == ()


def test_load_is_first_and_a_phase_past_what_is_left_is_cut() -> None:
    """A model load (Ollama's) takes its share first; a prefill the engine's clock makes
    longer than what is left of TTFT is cut to it, and other is 0, never negative."""
    phases = split_ttft(1000 * MS, 10 * MS, 0.9, None, 0.2)
    assert phases == TtftPhases(10 * MS, 900 * MS, None, 90 * MS, 0)


def test_before_the_engine_is_at_most_ttft_and_never_negative() -> None:
    assert split_ttft(100 * MS, 150 * MS) == TtftPhases(100 * MS, None, None, None, 0)
    assert split_ttft(100 * MS, -5) == TtftPhases(0, None, None, None, 100 * MS)
    assert split_ttft(100 * MS, None) == TtftPhases(0, None, None, None, 100 * MS)
    assert split_ttft(-1, 5, 0.1, 0.1, 0.1) == TtftPhases(0, 0, 0, 0, 0)


def test_a_negative_report_counts_as_nothing_and_milliseconds_round_to_nanoseconds() -> None:
    phases = split_ttft(100 * MS, 0, None, -0.5, 0.0123456789)
    assert phases == TtftPhases(0, None, 0, 12_345_679, 100 * MS - 12_345_679)


seconds = st.none() | st.floats(min_value=-1.0, max_value=100.0, allow_nan=False)


@FAST
@given(
    st.integers(-10, 10**11), st.none() | st.integers(-(10**9), 10**11), seconds, seconds, seconds
)
def test_phases_sum_to_ttft_exactly(
    ttft: int, before: int | None, load: float | None, queue: float | None, prefill: float | None
) -> None:
    phases = split_ttft(ttft, before, load, queue, prefill)
    assert sum(ns for _, ns in phases.present()) == max(ttft, 0)
    assert all(ns >= 0 for _, ns in phases.present())
    assert [p for p, _ in phases.present()][1:-1] == list(phases.reported)
    assert (phases.load_ns is None, phases.queue_ns is None, phases.prefill_ns is None) == (
        load is None, queue is None, prefill is None)  # fmt: skip


def test_a_nanosecond_before_the_engine_is_kept() -> None:
    assert split_ttft(10, 1) == TtftPhases(1, None, None, None, 9)
