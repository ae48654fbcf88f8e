"""Every test of the wire runs with no illegal transition (``states.ILLEGAL``): each would be a
bug that a connection caught and closed on, which a test looking only at responses can miss."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from llmobs.wire.states import ILLEGAL


@pytest.fixture
def illegal() -> Callable[[str], int]:
    """For a test that makes illegal transitions on purpose: how many a leg met in it so far."""
    before = Counter(ILLEGAL)
    return lambda leg: ILLEGAL[leg] - before[leg]


@pytest.fixture(autouse=True)
def no_illegal_transitions(request: pytest.FixtureRequest) -> Iterator[None]:
    before = Counter(ILLEGAL)
    yield
    if "illegal" not in request.fixturenames:
        assert before == ILLEGAL, "an illegal transition, a bug: see the log"
