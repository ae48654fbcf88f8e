"""Assertions on the simulated engine's timing: a schedule is kept when no token is early and
the median one is late by little."""

from __future__ import annotations

import itertools
import statistics


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def assert_near(measured: float, expected: float, slack: float = 0.015) -> None:
    assert abs(measured - expected) <= slack, (measured, expected)


def assert_on_schedule(times: list[float], expected: list[float]) -> None:
    """Never early (2 ms for timer granularity), and late by little on the median.

    Checked on absolute times, not gaps: one late token shortens the gap after it, but the
    next token is still due at its own deadline.
    """
    lateness = [t - e for t, e in zip(times, expected, strict=True)]
    assert min(lateness) >= -0.002, lateness
    assert statistics.median(lateness) <= 0.015, lateness
