"""Every test of the wire runs with no illegal transition: each would be a bug that a
connection caught, reported and closed on, which a test looking only at responses can miss.
Both legs report one the same way (``states.illegal``: an error record on ``llmobs.wire``
that carries the ``IllegalTransition``); this counts those records, per leg. And ``serve``: the
client leg's server on loopback, for the tests of the modules it runs (``server``,
``request``, ``flow``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from llmobs.wire.states import IllegalTransition
from tests.support.protocol_server import ServeFactory, serving


class _Illegal(logging.Handler):
    """Counts, per leg, the records of illegal transitions."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        error = getattr(record, "illegal", None)
        if isinstance(error, IllegalTransition):
            self.seen[error.leg] += 1


@pytest.fixture
def _illegal_seen() -> Iterator[_Illegal]:
    handler = _Illegal()
    logger = logging.getLogger("llmobs.wire")
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


@pytest.fixture
async def serve() -> AsyncIterator[ServeFactory]:
    """``await serve(handler, client_timeout=..., max_body=...)``: a ProxyServer on loopback,
    shut down (and its clients closed) when the test ends."""
    async with serving() as start:
        yield start
