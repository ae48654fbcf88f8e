"""The knee search: doubling to the first failure, halving the bracket to the precision."""

from __future__ import annotations

import pytest

from llmobs.tools.capacity.search import Search


def run(search: Search, knee: float) -> list[float]:
    """The loads tried against an engine whose objectives hold up to ``knee``."""
    tried = []
    while (load := search.next()) is not None:
        tried.append(load)
        search.record(load, load <= knee)
        assert len(tried) < 50
    return tried


@pytest.mark.parametrize("knee", [1, 2, 3, 6, 7, 9, 10, 13, 100, 255])
def test_an_integer_search_finds_the_knee_exactly(knee: int) -> None:
    search = Search(start=1, precision=0.001, limit=1024)
    tried = run(search, knee)
    assert search.knee == knee
    assert search.failed == knee + 1
    assert len(tried) == len(set(tried))  # no level run twice


def test_the_first_levels_double_then_the_bracket_halves() -> None:
    search = Search(start=1, precision=0.05)
    assert run(search, 6) == [1, 2, 4, 8, 6, 7]


def test_the_precision_stops_a_search_early() -> None:
    search = Search(start=10, precision=0.2, limit=1000)
    tried = run(search, 137)
    assert search.knee is not None and search.failed is not None
    assert search.knee <= 137 < search.failed
    assert search.failed - search.knee <= 0.2 * search.knee
    assert len(tried) < len(run(Search(start=10, precision=0.01, limit=1000), 137))


def test_a_rate_search_brackets_the_knee_to_its_precision() -> None:
    search = Search(start=0.5, precision=0.05, limit=64, integer=False)
    run(search, 3.3)
    assert search.knee is not None and search.failed is not None
    assert search.knee <= 3.3 < search.failed
    assert search.failed - search.knee <= 0.05 * search.knee


def test_nothing_holds_when_the_first_client_breaks_the_objectives() -> None:
    search = Search(start=1)
    assert run(search, 0) == [1]
    assert search.knee is None
    assert search.failed == 1


def test_a_start_that_fails_searches_below_it() -> None:
    search = Search(start=16)
    run(search, 5)
    assert (search.knee, search.failed) == (5, 6)


def test_the_limit_ends_a_climb_that_never_fails() -> None:
    search = Search(start=1, limit=20)
    tried = run(search, 1000)
    assert tried == [1, 2, 4, 8, 16, 20]
    assert search.knee == 20
    assert search.failed is None


def test_a_noisy_pass_above_a_failure_is_not_the_knee() -> None:
    search = Search(start=1)
    for load, holds in ((1, True), (2, True), (4, False), (8, True)):
        search.record(load, holds)
    assert (search.knee, search.failed) == (2, 4)
    assert search.next() == 3


def test_a_rate_that_never_holds_gives_up_a_precision_below_the_start() -> None:
    search = Search(start=1.0, precision=0.1, integer=False)
    tried = run(search, knee=0.0)
    assert search.knee is None
    assert min(tried) <= 0.1 < min(tried) * 2
    assert len(tried) <= 6
