"""What the relay tells observation, and the observer it uses when there is none.

The relay knows observation only through these shapes (``observer.Observer`` implements
them), so that ``--no-instrument`` is the same relay with ``NULL_OBSERVER`` in its place.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Protocol

from llmobs.observe.dialects import Route
from llmobs.observe.record import Arrival
from llmobs.observe.timing import Outcome


class RequestObserver(Protocol):
    """What the relay tells observation; implemented by ``observer.Observer``."""

    def request_body(self, body: bytes) -> None: ...
    def inject(self, headers: MutableMapping[str, str]) -> None: ...
    def forwarded(self, t_ns: int) -> None: ...
    def response(self, status: int, content_type: str, encoding: str = "") -> None: ...
    def held(self, t_ns: int) -> None: ...
    def released(self, t_ns: int) -> None: ...
    def chunk(self, t_ns: int, data: bytes) -> None: ...
    def trailers(self, fields: list[tuple[str, str]]) -> None: ...
    def finish(self, t_ns: int, outcome: Outcome) -> object: ...


class ObserverFactory(Protocol):
    """Makes a request's observer; ``traces``: its observers add a trace context upstream."""

    @property
    def traces(self) -> bool: ...
    def __call__(self, route: Route, start_ns: int, arrival: Arrival) -> RequestObserver: ...


class NullObserver:
    """Observation switched off (``--no-instrument``): a bare relay, for comparison."""

    __slots__ = ()

    def request_body(self, body: bytes) -> None:
        pass

    def inject(self, headers: MutableMapping[str, str]) -> None:
        pass

    def forwarded(self, t_ns: int) -> None:
        pass

    def response(self, status: int, content_type: str, encoding: str = "") -> None:
        pass

    def held(self, t_ns: int) -> None:
        pass

    def released(self, t_ns: int) -> None:
        pass

    def chunk(self, t_ns: int, data: bytes) -> None:
        pass

    def trailers(self, fields: list[tuple[str, str]]) -> None:
        pass

    def finish(self, t_ns: int, outcome: Outcome) -> object:
        return None


NULL_OBSERVER = NullObserver()
