"""Every test of the wire runs with no illegal transition: each would be a bug that a
connection caught, logged and closed on, which a test looking only at responses can miss. The
connections log each one as an error on their leg's logger; this counts those records."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

LEGS = {"llmobs.server": "client", "llmobs.upstream": "engine"}


class _Illegal(logging.Handler):
    """Counts, per leg, the log records of illegal transitions."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name in LEGS and "is not a transition" in record.getMessage():
            self.seen[LEGS[record.name]] += 1


@pytest.fixture
def _illegal_seen() -> Iterator[_Illegal]:
    handler = _Illegal()
    logger = logging.getLogger("llmobs")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def illegal(_illegal_seen: _Illegal) -> Callable[[str], int]:
    """For a test that makes illegal transitions on purpose: how many a leg met in it so far."""
    return lambda leg: _illegal_seen.seen[leg]


@pytest.fixture(autouse=True)
def no_illegal_transitions(
    request: pytest.FixtureRequest, _illegal_seen: _Illegal
) -> Iterator[None]:
    yield
    if "illegal" not in request.fixturenames:
        assert not _illegal_seen.seen, "an illegal transition, a bug: see the log"
