"""The prefill backlog: the engine's pace fitted from its services, the seconds left (what a
latency is against its objective: tests/unit/observe/test_slo.py)."""

from __future__ import annotations

import pytest

from llmobs.observe.disagg import PdRole
from llmobs.observe.saturation import (
    GROUP_NS,
    KEEP,
    MAX_PENDING,
    Backlog,
    Backlogs,
    PrefillBacklog,
    ServiceFit,
)

MS = 1_000_000
S = 1_000_000_000


def _serial(backlog: PrefillBacklog, sizes: list[int], cost: tuple[float, float],
            start: int = 0) -> int:  # fmt: skip
    """Prompts of ``sizes`` bytes, all waiting at ``start``, served one after the other by
    an engine taking ``a + b * size`` seconds each; returns when the last was served."""
    a, b = cost
    for size in sizes:
        backlog.enter(start, size)
    t = start
    for size in sizes:
        t += round((a + b * size) * S)
        backlog.depart(t, size)
    return t


def test_two_costs_are_told_apart_when_the_sizes_vary() -> None:
    fit = ServiceFit()
    for size in (100, 4000, 800, 2500, 50, 3000):
        fit.add(1, size, 0.02 + 0.0001 * size)
    assert fit.samples == 6
    a, b = fit.costs() or (0.0, 0.0)
    assert a == pytest.approx(0.02, rel=1e-6)
    assert b == pytest.approx(0.0001, rel=1e-6)
    assert fit.predict(3, 1000) == pytest.approx(0.06 + 0.1, rel=1e-6)


def test_one_size_fits_one_cost_that_predicts_that_size() -> None:
    """Sizes that never vary cannot tell a per-request cost from a per-byte one: the fit
    takes one, which predicts the size it saw exactly."""
    fit = ServiceFit()
    for _ in range(5):
        fit.add(1, 2000, 0.42)
    assert fit.predict(1, 2000) == pytest.approx(0.42)
    assert fit.predict(4, 8000) == pytest.approx(1.68)
    a, b = fit.costs() or (-1.0, -1.0)
    assert a == 0 and b == pytest.approx(0.42 / 2000)  # a prefill grows with its prompt


def test_sizes_within_a_fifth_are_not_told_apart() -> None:
    """Two sizes 20 % apart: the two costs would rest on their difference alone (noise, in
    a real engine); the cost per byte alone is fitted."""
    fit = ServiceFit()
    for size in (1000, 1200, 1000, 1200):
        fit.add(1, size, 0.02 + 0.0002 * size)
    a, b = fit.costs() or (-1.0, -1.0)
    assert a == 0 and b == pytest.approx(0.00022, rel=0.01)


def test_prompts_of_no_bytes_cost_per_request() -> None:
    fit = ServiceFit()
    fit.add(1, 0, 0.25)
    fit.add(2, 0, 0.5)
    assert fit.costs() == (0.25, 0.0)


def test_no_sample_no_costs() -> None:
    assert ServiceFit().costs() is None
    assert ServiceFit().predict(1, 10) is None


def test_a_negative_cost_is_never_fitted() -> None:
    """Time that falls as prompts grow (noise) is not a negative cost per byte: the one
    cost that explains the samples alone."""
    fit = ServiceFit()
    for size, took in ((100, 0.5), (1000, 0.4), (2000, 0.3), (4000, 0.2)):
        fit.add(1, size, took)
    a, b = fit.costs() or (-1.0, -1.0)
    assert b == 0 and a == pytest.approx(0.35, rel=0.02)  # (recent ones weigh more)
    fit = ServiceFit()  # and a per-request cost below 0: the per-byte one alone
    for size, took in ((1000, 0.05), (2000, 0.2), (3000, 0.35), (4000, 0.5)):
        fit.add(1, size, took)
    a, b = fit.costs() or (-1.0, -1.0)
    assert a == 0 and b > 0


def test_recent_services_weigh_more() -> None:
    """An engine that slows down (a longer context, a second model) is followed."""
    fit = ServiceFit()
    for _ in range(200):
        fit.add(1, 1000, 0.1)
    for _ in range(200):
        fit.add(1, 1000, 0.3)
    assert fit.predict(1, 1000) == pytest.approx(0.3, rel=0.05)  # 200 later: the old 4 %


def test_the_backlog_is_the_fitted_work_less_what_the_current_service_did() -> None:
    backlog = PrefillBacklog()
    cost = (0.02, 0.0002)
    t = _serial(backlog, [500, 2000, 1200, 300], cost)  # the pace, learnt
    assert backlog.read(t + GROUP_NS + 1).seconds == 0.0
    start = t + S
    for size in (1000, 1500, 800):
        backlog.enter(start, size)
    truth = sum(cost[0] + cost[1] * size for size in (1000, 1500, 800))
    assert backlog.read(start).seconds == pytest.approx(truth, rel=1e-6)
    later = backlog.read(start + 100 * MS)  # the engine has worked 0.1 s on it since
    assert later.seconds == pytest.approx(truth - 0.1, rel=1e-6)
    assert later.requests == 3
    # the first served: the rest's work, from its departure
    first = start + round((cost[0] + cost[1] * 1000) * S)
    backlog.depart(first, 1000)
    assert backlog.read(first).seconds == pytest.approx(truth - 0.22, rel=1e-6)


def test_a_batch_served_in_one_step_falls_as_the_step_runs() -> None:
    """An engine that prefills every waiting prompt in one step answers them together: one
    service; the backlog falls with the step, as the time left to its end does."""
    backlog = PrefillBacklog()
    for round_ in range(4):
        start = round_ * 10 * S
        sizes = [400 + 300 * i + 50 * round_ for i in range(3 + round_)]
        for size in sizes:
            backlog.enter(start, size)
        step = round(sum(0.02 + 0.0002 * size for size in sizes) * S)
        for i, size in enumerate(sizes):  # answered within a millisecond of each other
            backlog.depart(start + step + i * 100_000, size)
    start = 50 * S
    sizes = [1000] * 5
    for size in sizes:
        backlog.enter(start, size)
    truth = 5 * (0.02 + 0.0002 * 1000)
    for elapsed in (0.0, 0.3, 0.9):
        read = backlog.read(start + round(elapsed * S)).seconds
        assert read == pytest.approx(truth - elapsed, abs=1e-3), elapsed  # (answers: 0.5 ms)
    assert backlog.read(start + 2 * S).seconds == 0.0  # late: nothing left, never below 0


def test_departures_far_apart_are_services_of_their_own() -> None:
    backlog = PrefillBacklog()
    backlog.enter(0, 100)
    backlog.enter(0, 100)
    backlog.depart(100 * MS, 100)
    backlog.depart(100 * MS + GROUP_NS + 1, 100)  # a service of its own, of ~2 ms
    backlog.read(S)
    assert (backlog.alone.samples, backlog.service.samples) == (1, 1)
    assert backlog.alone.predict(1, 100) == pytest.approx(0.1)  # began idle
    assert backlog.service.predict(1, 100) == pytest.approx(0.002, rel=0.01)  # back to back


def test_the_pace_is_the_busy_engine_s_once_seen() -> None:
    """A prompt that came to an idle engine took its trip to the engine as well: the pace
    until a busy engine was seen, not after."""
    backlog = PrefillBacklog()
    for n in range(5):  # alone: 30 ms of trip and 100 ms of prefill each
        backlog.enter(n * S, 100)
        backlog.depart(n * S + 130 * MS, 100)
    backlog.enter(10 * S, 100)
    assert backlog.read(10 * S).seconds == pytest.approx(0.13)
    backlog.depart(10 * S + 130 * MS, 100)
    for _ in range(3):  # back to back: the prefill alone
        backlog.enter(20 * S, 100)
    for n in range(3):
        backlog.depart(20 * S + 130 * MS + (n + 1) * 100 * MS, 100)
    backlog.enter(30 * S, 100)
    backlog.enter(30 * S, 100)
    assert backlog.read(30 * S).seconds == pytest.approx(0.2)
    assert backlog.pace() is backlog.service


def test_the_backlog_is_unknown_until_a_first_service_and_zero_when_nothing_waits() -> None:
    backlog = PrefillBacklog()
    assert backlog.read(0) == Backlog(0, 0.0, 0.0, 0.0)
    backlog.enter(S, 100)
    read = backlog.read(3 * S)
    assert read.requests == 1 and read.seconds is None and read.tokens is None
    assert read.busy_seconds == pytest.approx(2.0)


def test_an_abandoned_prompt_leaves_no_sample_and_no_work() -> None:
    backlog = PrefillBacklog()
    _serial(backlog, [1000, 1000], (0.1, 0.0))
    backlog.enter(10 * S, 1000)
    backlog.enter(10 * S, 3000)
    backlog.abandon(10 * S + 50 * MS, 3000)  # its client went away
    read = backlog.read(10 * S + 50 * MS)
    assert read.requests == 1
    assert read.seconds == pytest.approx(0.05)  # one prompt's 0.1 s, 0.05 s of it done
    backlog.abandon(10 * S + 60 * MS, 1000)
    assert backlog.read(11 * S).requests == 0
    assert backlog.alone.samples + backlog.service.samples == 2  # none from the abandoned


def test_busy_time_counts_only_while_prompts_wait() -> None:
    backlog = PrefillBacklog()
    backlog.enter(S, 10)
    backlog.depart(3 * S, 10)
    backlog.enter(10 * S, 10)
    assert backlog.read(11 * S).busy_seconds == pytest.approx(3.0)
    backlog.depart(12 * S, 10)
    assert backlog.read(20 * S).busy_seconds == pytest.approx(4.0)


def test_a_clock_that_steps_back_never_makes_negative_time() -> None:
    backlog = PrefillBacklog()
    _serial(backlog, [100, 100], (0.1, 0.0), start=10 * S)
    backlog.enter(20 * S, 100)
    read = backlog.read(19 * S)  # (a monotonic clock never does; a caller's mistake)
    assert read.seconds == pytest.approx(0.1)
    assert read.busy_seconds >= 0


def test_a_departure_never_entered_changes_nothing() -> None:
    backlog = PrefillBacklog()
    backlog.depart(S, 100)
    backlog.abandon(S, 100)
    assert backlog.read(2 * S) == Backlog(0, 0.0, 0.0, 0.0)
    assert backlog.service.samples == backlog.alone.samples == 0


def test_tokens_are_estimated_from_bytes_by_what_the_engine_counted() -> None:
    backlog = PrefillBacklog()
    for size in (400, 1200, 4000, 800):
        backlog.learn(size, 20 + size // 4)  # an envelope of 20 tokens, 4 bytes a token
    backlog.enter(0, 2000)
    backlog.enter(0, 1000)
    tokens = backlog.read(0).tokens
    assert tokens == pytest.approx(40 + 750, rel=0.01)


def test_each_role_has_its_backlog_and_a_whole_request_s_is_always_read() -> None:
    backlogs = Backlogs()
    assert backlogs.whole is backlogs.of[PdRole.WHOLE]  # (the usual one, an attribute)
    assert set(backlogs.read(0)) == {PdRole.WHOLE}
    backlogs.of[PdRole.PREFILL_LEG].enter(0, 100)
    backlogs.of[PdRole.PREFILL_LEG].enter(0, 100)
    assert backlogs.of[PdRole.PREFILL_LEG].entered == 2
    found = backlogs.read(S)
    assert set(found) == {PdRole.WHOLE, PdRole.PREFILL_LEG}
    assert found[PdRole.PREFILL_LEG].requests == 2 and found[PdRole.WHOLE].requests == 0


def test_a_service_is_its_departures_within_2_ms_of_its_first() -> None:
    """Counted from the service's first departure, not chained from one to the next; one
    exactly 2 ms after is in it, one read then does not close it."""
    backlog = PrefillBacklog()
    for _ in range(4):
        backlog.enter(0, 100)
    first = 100 * MS
    backlog.depart(first, 100)
    backlog.read(first)  # a read within the service leaves it open
    backlog.depart(first + GROUP_NS // 2, 100)
    backlog.read(first + GROUP_NS)  # and one exactly at its end
    backlog.depart(first + GROUP_NS, 100)
    backlog.depart(first + GROUP_NS + GROUP_NS // 2, 100)  # 1 ms after the last: a new one
    backlog.read(S)
    assert (backlog.alone.samples, backlog.service.samples) == (1, 1)
    # the first: three prompts in 102 ms, from the first's arrival
    assert backlog.alone.predict(3, 300) == pytest.approx(0.102)


def test_a_read_closes_a_service_once_past_its_first_2_ms() -> None:
    """Its pace is then known to a read, though the last departure was a moment ago."""
    backlog = PrefillBacklog()
    for _ in range(3):
        backlog.enter(0, 100)
    backlog.depart(100 * MS, 100)
    backlog.depart(100 * MS + GROUP_NS * 3 // 4, 100)
    read = backlog.read(100 * MS + GROUP_NS * 5 // 4)  # past the first's 2 ms, not the last's
    assert read.requests == 1 and read.seconds is not None


def test_time_that_does_not_grow_with_the_prompt_is_a_cost_per_request() -> None:
    """Exact in binary: a request of 0 bytes and one of 2, a second each."""
    fit = ServiceFit()
    fit.add(1, 0, 1.0)
    fit.add(1, 2, 1.0)
    assert fit.costs() == (1.0, 0.0)


def test_times_are_exact_to_the_nanosecond() -> None:
    """A service of exactly 1 s is 1.0 s; a wait of no time is no busy time; what is left
    of a service is its fitted time less exactly what has passed."""
    at_once = PrefillBacklog()
    at_once.enter(S, 0)
    at_once.depart(S, 0)  # served the moment it came: no time
    assert at_once.read(2 * S).busy_seconds == 0.0
    assert at_once.alone.predict(1, 0) == 0.0
    backlog = PrefillBacklog()
    backlog.enter(S, 0)
    assert backlog.read(S).busy_seconds == 0.0
    backlog.depart(2 * S, 0)  # served alone, in exactly 1 s
    assert backlog.read(4 * S).busy_seconds == 1.0
    assert backlog.alone.predict(1, 0) == 1.0
    backlog.enter(5 * S, 0)
    assert backlog.read(5 * S).seconds == 1.0
    assert backlog.read(5 * S + S // 2).seconds == 0.5
    assert backlog.read(5 * S + S // 2).busy_seconds == 1.5


def test_what_is_noted_unread_stays_bounded() -> None:
    """No scrape for a long while: departures and usages are fitted once MAX_PENDING wait."""
    backlog = PrefillBacklog()
    for n in range(MAX_PENDING):
        backlog.enter(n * S, 100)
        backlog.depart(n * S + 100 * MS, 100)
        backlog.learn(100, 25)
    assert backlog.alone.samples == MAX_PENDING - 1  # the last service may go on
    assert backlog.tokens.samples == MAX_PENDING
    assert backlog.alone.predict(1, 100) == pytest.approx(0.1)
    assert backlog.tokens.predict(1, 100) == pytest.approx(25)


def test_busy_time_ends_with_the_last_prompt_however_it_leaves() -> None:
    """Exact: a busy period from the first arrival to the last leaving, served or not."""
    backlog = PrefillBacklog()
    backlog.enter(3 * S, 10)
    backlog.enter(3 * S, 10)
    backlog.depart(4 * S, 10)  # one of two: still busy
    backlog.depart(5 * S, 10)
    assert backlog.read(6 * S).busy_seconds == 2.0
    backlog.enter(7 * S, 10)
    backlog.enter(7 * S, 10)
    backlog.abandon(8 * S, 10)
    assert backlog.read(8 * S).busy_seconds == 3.0
    backlog.abandon(10 * S, 10)  # the last, gone unserved: the period ends
    assert backlog.read(11 * S).busy_seconds == 5.0


def test_a_service_whose_clock_stepped_back_took_no_time() -> None:
    """(A monotonic clock never does.) Closed at the next departure or at a read, alike."""
    for close_at_read in (True, False):
        backlog = PrefillBacklog()
        backlog.enter(10 * S, 0)
        backlog.depart(9 * S, 0)  # before its arrival
        if not close_at_read:
            backlog.enter(20 * S, 0)
            backlog.depart(21 * S, 0)
        backlog.read(30 * S)
        # the second (1 s, weighing 1) after the first (0 s, weighing KEEP)
        assert backlog.alone.costs() == ((0.0 if close_at_read else 1 / (1 + KEEP)), 0.0)


def test_a_service_of_a_second_closed_by_the_next_is_a_second() -> None:
    backlog = PrefillBacklog()
    backlog.enter(S, 0)
    backlog.enter(S, 0)
    backlog.depart(2 * S, 0)
    backlog.depart(3 * S, 0)  # closes the first: exactly 1 s, idle; itself 1 s, busy
    backlog.read(3 * S)  # within its 2 ms: the second stays open
    assert backlog.alone.costs() == (1.0, 0.0)
    assert backlog.service.samples == 0
