"""``llmobs why``'s figures (pure): per operation and model and in all, where the TTFT misses
went (the phase that took most of each missed TTFT), why the gap and stall misses happened
(the cause of each request's longest stall), the stalls by cause, and the TTFT seconds spent
in each phase. The sidecars counted them (``observe.causes``, ``observe.phases``); this only
adds them up: samples in (``samples.Sample``, from either source), ``Why`` per label set out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmobs.config.objectives import Objective
from llmobs.export.metrics.catalogue import SLO_MISSES, STALLS, TTFT_PHASE
from llmobs.tools.slo.samples import MODEL, OPERATION, Sample

Key = tuple[str, str]
ALL: Key = ("all", "all")  # every label set together

_MISSES, _STALLS, _PHASE_SUM = (
    SLO_MISSES.prometheus,
    STALLS.prometheus,
    TTFT_PHASE.prometheus + "_sum",
)
_GAP_OBJECTIVES = frozenset({Objective.MAX_GAP.value, Objective.STALL.value})


@dataclass
class Why:
    """One label set's counts: misses and stalls by cause, TTFT seconds by phase."""

    ttft_misses: dict[str, float] = field(default_factory=dict)
    gap_misses: dict[str, float] = field(default_factory=dict)
    stalls: dict[str, float] = field(default_factory=dict)
    ttft_seconds: dict[str, float] = field(default_factory=dict)

    def parts(self) -> dict[str, dict[str, float]]:
        return {"ttft_misses": self.ttft_misses, "gap_misses": self.gap_misses,
                "stalls": self.stalls, "ttft_seconds": self.ttft_seconds}  # fmt: skip

    @property
    def empty(self) -> bool:
        return not any(sum(part.values()) > 0 for part in self.parts().values())

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        """One sample of a family that says why, by its name."""
        cause = labels.get("cause", "")
        if name == _MISSES:
            objective = labels.get("objective", "")
            if objective == Objective.TTFT.value:
                _add(self.ttft_misses, cause, value)
            elif objective in _GAP_OBJECTIVES:
                _add(self.gap_misses, cause, value)
        elif name == _STALLS:
            _add(self.stalls, cause, value)
        elif name == _PHASE_SUM:
            _add(self.ttft_seconds, labels.get("phase", ""), value)


def _add(into: dict[str, float], key: str, value: float) -> None:
    if value > 0:
        into[key] = into.get(key, 0.0) + value


def tally(samples: Iterable[Sample]) -> dict[Key, Why]:
    """Each label set's ``Why``, and all of them together under ``ALL``; label sets with
    nothing to say are left out. A miss of both max_gap and stall counts once each."""
    out: dict[Key, Why] = {}
    for name, labels, value in samples:
        if math.isnan(value) or value <= 0:  # nothing
            continue
        key = (labels.get(OPERATION, ""), labels.get(MODEL, ""))
        for target in (key, ALL):
            out.setdefault(target, Why()).add(name, labels, value)
    return {key: why for key, why in out.items() if not why.empty}


def queries(window: str) -> dict[str, str]:
    """The families that say why, summed per label set and cause (or phase) over
    ``window``, as PromQL: family name -> query."""
    by = f"{OPERATION}, {MODEL}"
    return {
        _MISSES: f"sum by ({by}, objective, cause) (increase({_MISSES}[{window}]))",
        _STALLS: f"sum by ({by}, cause) (increase({_STALLS}[{window}]))",
        _PHASE_SUM: f"sum by ({by}, phase) (increase({_PHASE_SUM}[{window}]))",
    }
