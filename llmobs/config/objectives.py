"""Service-level objectives as declared: the bounds a request is judged by, per model and
operation, from the flags and an optional YAML file (``--slo-file``). Judging a finished
request against its set is observation's (``llmobs.observe.slo``).

The YAML file holds per-model and per-operation overrides of the flags' set::

    objectives:
      - model: llama-3.1-8b        # the requested model, as sent (optional)
        operation: chat            # chat, text_completion, embeddings, ... (optional)
        tenant: customer-a         # the tenant's label (--tenant-header, --tenant-keys; optional)
        ttft: 500ms
        tpot: 50ms
        max_gap: 1s                # or no_stalls: true
        duration: 60s
        target: 0.995
        window: 28d

The most specific entry wins: one naming the tenant first (a customer's objective is its
contract), then the model and operation, the model, the operation; a field an entry leaves out
is the default set's.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmobs.config.options import ConfigError, parse_duration, read_yaml


class Objective(enum.StrEnum):
    """What a bad request missed (a label value: a closed set)."""

    TTFT = "ttft"
    TPOT = "tpot"
    MAX_GAP = "max_gap"
    STALL = "stall"
    DURATION = "duration"
    ERROR = "error"  # failed in a way the user sees: 5xx, engine error or timeout, cut short


DEFAULT_TARGET = 0.999  # the default set bounds no latency: an availability objective
DEFAULT_WINDOW = 28 * 86400.0

# (operation, model, tenant) an override matches; None: any
_Key = tuple[str | None, str | None, str | None]
# the keys looked up for a request, most specific first: tenant, then model and operation
_ORDER = ((1, 1, 1), (0, 1, 1), (1, 0, 1), (0, 0, 1), (1, 1, 0), (0, 1, 0), (1, 0, 0))


class ObjectiveError(ConfigError):
    """A field of an objective set that is not valid; ``field`` names it, for the caller
    to name where it came from (a flag, a variable, an entry of the file)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ObjectiveSet:
    """The bounds one request is judged by (seconds; None: not bounded), the share of requests
    that should be good (``target``) and the window that share is measured over."""

    ttft: float | None = None
    tpot: float | None = None
    max_gap: float | None = None
    no_stalls: bool = False
    duration: float | None = None
    target: float = DEFAULT_TARGET
    window: float = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "max_gap", "duration"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ObjectiveError(name, f"must be > 0 seconds, got {value}")
        if not 0 < self.target < 1:
            raise ObjectiveError("target", f"must be above 0 and below 1, got {self.target}")
        if not self.window >= 3600:
            raise ObjectiveError("window", f"must be at least 1h, got {self.window:g}s")

    @property
    def objectives(self) -> tuple[Objective, ...]:
        """The objectives a request of this set can miss: its bounds, and ``error``."""
        bounded = (
            (Objective.TTFT, self.ttft is not None),
            (Objective.TPOT, self.tpot is not None),
            (Objective.MAX_GAP, self.max_gap is not None),
            (Objective.STALL, self.no_stalls),
            (Objective.DURATION, self.duration is not None),
        )
        return (*(o for o, on in bounded if on), Objective.ERROR)

    def bounds(self) -> tuple[tuple[str, float], ...]:
        """Each bound set, in seconds, by its objective's name (the bound gauge's series)."""
        named = (
            (Objective.TTFT, self.ttft), (Objective.TPOT, self.tpot),
            (Objective.MAX_GAP, self.max_gap), (Objective.DURATION, self.duration),
        )  # fmt: skip
        return tuple((o.value, value) for o, value in named if value is not None)


class Objectives:
    """The default set and its overrides: which set judges a request of (operation, model,
    tenant)."""

    def __init__(
        self,
        default: ObjectiveSet,
        overrides: Mapping[_Key, ObjectiveSet] | None = None,
    ) -> None:
        self.default = default
        self.overrides = dict(overrides or {})
        # the lookups that can match: those whose named fields some override names
        used = {tuple(int(v is not None) for v in key) for key in self.overrides}
        self._order = tuple(shape for shape in _ORDER if shape in used)

    def for_request(
        self, operation: str, model: str | None, tenant: str | None = None
    ) -> ObjectiveSet:
        """The most specific set (tenant first, then model and operation), or the default."""
        if not self.overrides:
            return self.default
        get, values = self.overrides.get, (operation, model, tenant)
        for shape in self._order:
            key = tuple(v if on else None for v, on in zip(values, shape, strict=True))
            if all(v is not None for v, on in zip(key, shape, strict=True) if on):
                found = get(key)  # type: ignore[arg-type]
                if found is not None:
                    return found
        return self.default

    @property
    def sets(self) -> list[ObjectiveSet]:
        """Every set (the default first)."""
        return [self.default, *self.overrides.values()]

    @property
    def windows(self) -> list[float]:
        """The distinct windows of all sets, in ascending order."""
        return sorted({s.window for s in self.sets})


# fields an entry of the file may give, and how each is read
_DURATIONS = ("ttft", "tpot", "max_gap", "duration", "window")
_MATCH = ("model", "operation", "tenant")


def _field(name: str, value: Any) -> Any:
    if name in _DURATIONS:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{name}: expected a duration such as 500ms, 2s or 28d")
        return float(value) if not isinstance(value, str) else parse_duration(value)
    if name == "no_stalls":
        if not isinstance(value, bool):
            raise ConfigError("no_stalls: expected true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"target: expected a number such as 0.99, got {value!r}")
    return float(value)


def _entry(default: ObjectiveSet, raw: Any, where: str) -> tuple[_Key, ObjectiveSet]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of fields")
    fields = {f.name for f in dataclasses.fields(ObjectiveSet)}
    unknown = sorted(set(raw) - fields - set(_MATCH))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}")
    match = tuple(raw.get(k) for k in _MATCH)
    if not any(match) or not all(v is None or isinstance(v, str) for v in match):
        raise ConfigError(f"{where}: name a model, an operation or a tenant to match")
    try:
        changes = {k: _field(k, v) for k, v in raw.items() if k in fields}
        objective_set = dataclasses.replace(default, **changes)
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    model, operation, tenant = match
    return (operation, model, tenant), objective_set


def load_overrides(path: str | Path, default: ObjectiveSet) -> dict[_Key, ObjectiveSet]:
    """The overrides of an objectives file (see the module's docstring); ConfigError, naming
    the file and the entry, for anything that is not one."""
    loaded = read_yaml(path, "--slo-file")
    entries = loaded.get("objectives") if isinstance(loaded, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"--slo-file {path}: expected a top-level list 'objectives:'")
    out: dict[_Key, ObjectiveSet] = {}
    for i, raw in enumerate(entries):
        key, objective_set = _entry(default, raw, f"--slo-file {path}: objectives[{i}]")
        if key in out:
            raise ConfigError(f"--slo-file {path}: objectives[{i}] repeats an earlier match")
        out[key] = objective_set
    return out


def build_objectives(default: ObjectiveSet, slo_file: str = "") -> Objectives:
    """The objectives the settings declare."""
    return Objectives(default, load_overrides(slo_file, default) if slo_file else None)


def describe(objective_set: ObjectiveSet) -> str:
    """One line for people: ``ttft <= 0.5s, tpot <= 0.05s, no stalls; 99% over 28d``."""
    parts = [
        f"{name} <= {value:g}s"
        for name, value in (
            ("ttft", objective_set.ttft), ("tpot", objective_set.tpot),
            ("max gap", objective_set.max_gap), ("duration", objective_set.duration),
        )
        if value is not None
    ]  # fmt: skip
    if objective_set.no_stalls:
        parts.append("no stalls")
    bounds = ", ".join(parts) or "no latency bound (errors only)"
    window = prometheus_duration(objective_set.window)
    return f"{bounds}; {objective_set.target:.4g} good over {window}"


def prometheus_duration(seconds: float) -> str:
    """A window as a Prometheus range spells it (``28d``, ``6h``), and as people read it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
