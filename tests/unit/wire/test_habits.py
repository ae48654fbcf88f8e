"""What the pool learns of how the engine keeps its connections (``wire/habits.py``): that it
closes one after each streamed response, learnt from a quick close after a stream only (not
after a plain response, nor from an idle timeout), settled the other way by a connection that
stayed open, and never unlearnt. The pool acting on it: tests/unit/wire/test_upstream.py."""

from __future__ import annotations

import logging

import pytest

from llmobs.wire.habits import QUICK_CLOSE, Habits


def test_the_habit_is_learnt_from_a_quick_close_after_a_stream_only() -> None:
    habits = Habits()
    habits.closed(streamed=False, idle_s=0.01)  # after a plain response: says nothing
    habits.closed(streamed=True, idle_s=4.5)  # an idle timeout: neither
    assert habits.closes_after_stream is None
    habits.settled()  # a stream's connection that stayed open: kept
    assert habits.closes_after_stream is False
    habits.closed(streamed=True, idle_s=0.005)  # then closed at once after a stream: learnt
    assert habits.closes_after_stream is True
    habits.settled()  # and not unlearnt
    assert habits.closes_after_stream is True


@pytest.mark.parametrize(
    ("streamed", "idle_s", "learnt"),
    [
        (True, 0.0, True),
        (True, QUICK_CLOSE * 0.99, True),
        (True, QUICK_CLOSE, None),  # as long as a keep-alive timeout might be: not the habit
        (False, 0.0, None),
    ],
)
def test_only_a_close_within_quick_close_of_a_stream_teaches_it(
    streamed: bool, idle_s: float, learnt: bool | None
) -> None:
    habits = Habits()
    habits.closed(streamed=streamed, idle_s=idle_s)
    assert habits.closes_after_stream is learnt


def test_a_close_after_it_settled_still_teaches_it_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection that stayed open ``SETTLE`` seconds said the engine keeps them; a quick
    close seen later says otherwise, and wins. The log says it once, however often it is
    seen again."""
    habits = Habits()
    habits.settled()
    with caplog.at_level(logging.INFO, logger="llmobs.upstream"):
        for _ in range(3):
            habits.closed(streamed=True, idle_s=0.001)
    assert habits.closes_after_stream is True
    (record,) = caplog.records
    assert "closes its connection after each streamed response" in record.getMessage()
