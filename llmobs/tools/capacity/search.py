"""The knee search (pure): the largest load at which the objectives hold, to a precision.

Loads double from ``start`` until a level fails (or ``limit`` is reached), then the bracket
between the highest load that held and the lowest that failed is halved until it is no
wider than ``precision`` of the load that held (and, for concurrency, one client: an
integer search ends with the two neighbours known). A level is run once; the answer is the
load that held, with the bracket that says how well it is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Search:
    """State of one search: what was tried and whether it held."""

    start: float = 1.0
    precision: float = 0.05  # the bracket's width, relative to the load that held
    limit: float = 1024.0  # the highest load tried
    integer: bool = True  # concurrency (clients) rather than a request rate
    tried: dict[float, bool] = field(default_factory=dict)

    def record(self, load: float, holds: bool) -> None:
        self.tried[load] = holds

    @property
    def held(self) -> float | None:
        """The highest load that held below every load that failed (None: none held)."""
        failed = self.failed
        passing = [x for x, ok in self.tried.items() if ok and (failed is None or x < failed)]
        return max(passing) if passing else None

    @property
    def failed(self) -> float | None:
        """The lowest load that failed (None: none did)."""
        failing = [x for x, ok in self.tried.items() if not ok]
        return min(failing) if failing else None

    def _width(self, held: float) -> float:
        width = self.precision * held
        return max(1.0, math.floor(width)) if self.integer else width

    def next(self) -> float | None:
        """The load to run next; None when the knee is known to the precision asked."""
        held, failed = self.held, self.failed
        if not self.tried:
            return self.start
        if failed is None:  # still climbing
            assert held is not None
            up = min(self.limit, held * 2)
            return up if up > held else None
        low = held if held is not None else 0.0
        if failed - low <= self._width(low if low > 0 else failed):
            return None
        if held is None and not self.integer and failed <= self.start * self.precision:
            return None  # a rate this far below the start broke them too: none will hold
        middle = (low + failed) / 2
        if self.integer:
            middle = math.floor(middle)
            if middle <= low:
                return None
        return middle

    @property
    def knee(self) -> float | None:
        """The answer: the highest load that held (None: not even ``start`` did, or none
        tried)."""
        return self.held
