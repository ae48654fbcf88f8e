"""Why a first token was slow: a request's TTFT split into phases that sum to it exactly.

TTFT as the sidecar measures it (the request's arrival to its first token's) is split into:

- ``before_engine``: arrival to the moment the whole request was handed to the engine (the
  client's upload, the sidecar, connecting): measured here;
- ``load``, ``queue``, ``prefill``: what the engine reports of this request, and only when it
  does (Ollama's ``load_duration`` and ``prompt_eval_duration``, llama.cpp's
  ``timings.prompt_ms``, vLLM's per-request ``metrics``: ``queue_time_ms`` and
  ``time_to_first_token_ms``, which vLLM counts from scheduling, so its prefill);
- ``other``: the rest (the network both ways, tokenising, the engine's HTTP layer; all of the
  engine's time when it reports nothing): measured here as what is left.

A request whose prefill ran on another pod (disaggregated prefill and decode, ``disagg``) has
three more, each from a measurement at one of our listeners or an engine's report:

- ``remote_prefill``: from its forwarding at the pod's entry to its decode leg's arrival at
  the decode engine's listener (the routing sidecar, the prefill leg's round trip), less the
  prefill engine's own ``queue`` and ``prefill`` when this process saw the prefill leg too;
- ``kv_transfer``: the decode engine's wait before it scheduled the decode leg (the KV
  cache's transfer, then a place in the batch: vLLM's ``queue_time_ms`` of the leg);
- ``first_decode``: the decode engine's first step (its ``time_to_first_token_ms``).

Nothing is guessed: an engine that reports no phase leaves its time in ``other``. Phases are
whole nanoseconds, so their sum is TTFT to the nanosecond; a reported phase longer than what is
left of TTFT (clocks on two machines, rounding to milliseconds) is cut to what is left, in the
order load, queue, prefill, and ``other`` is never negative. Pure: the times are arguments.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Phase(enum.StrEnum):
    """A part of TTFT (a label value: a closed set)."""

    BEFORE_ENGINE = "before_engine"
    LOAD = "load"
    QUEUE = "queue"
    PREFILL = "prefill"
    OTHER = "other"
    REMOTE_PREFILL = "remote_prefill"
    KV_TRANSFER = "kv_transfer"
    FIRST_DECODE = "first_decode"


class TtftPhases(NamedTuple):
    """A request's TTFT in phases, nanoseconds; None: not measured or reported. The phases of
    disaggregated prefill come last, after ``other``, so that a record of a whole request
    keeps its shape (made with ``tuple.__new__``: every field given)."""

    before_engine_ns: int
    load_ns: int | None
    queue_ns: int | None
    prefill_ns: int | None
    other_ns: int
    remote_prefill_ns: int | None = None
    kv_transfer_ns: int | None = None
    first_decode_ns: int | None = None

    def present(self) -> list[tuple[Phase, int]]:
        """Each phase measured or reported, with its nanoseconds, in the order they happen."""
        found = [(Phase.BEFORE_ENGINE, self.before_engine_ns)]
        for phase, ns in ((Phase.LOAD, self.load_ns), (Phase.QUEUE, self.queue_ns),
                          (Phase.PREFILL, self.prefill_ns),
                          (Phase.REMOTE_PREFILL, self.remote_prefill_ns),
                          (Phase.KV_TRANSFER, self.kv_transfer_ns),
                          (Phase.FIRST_DECODE, self.first_decode_ns)):  # fmt: skip
            if ns is not None:
                found.append((phase, ns))
        found.append((Phase.OTHER, self.other_ns))
        return found

    def largest(self) -> Phase:
        """The phase that took most of TTFT (the first of equals, in the order they
        happen): where a TTFT miss is counted."""
        best, most = Phase.BEFORE_ENGINE, -1
        for phase, ns in self.present():
            if ns > most:
                best, most = phase, ns
        return best

    @property
    def reported(self) -> tuple[Phase, ...]:
        """The phases an engine reported (the others the sidecar measured)."""
        return tuple(p for p, _ in self.present() if p not in _MEASURED)


def split_ttft(
    ttft_ns: int,
    before_engine_ns: int | None,
    load_s: float | None = None,
    queue_s: float | None = None,
    prefill_s: float | None = None,
) -> TtftPhases:
    """TTFT ``ttft_ns`` in phases: ``before_engine_ns`` measured (None: the request was
    forwarded before it arrived, as a test may make it: 0), the engine's reported seconds.
    Once per request: comparisons rather than ``min``/``max`` calls, and the tuple made by
    ``tuple.__new__`` (a named tuple's own ``__new__`` is a Python call)."""
    if ttft_ns < 0:  # noqa: PLR1730 - a comparison costs less than a call of max
        ttft_ns = 0
    before = before_engine_ns if before_engine_ns is not None and before_engine_ns > 0 else 0
    if before > ttft_ns:  # noqa: PLR1730 - as above
        before = ttft_ns
    left = ttft_ns - before
    if load_s is None and queue_s is None and prefill_s is None:  # most engines
        return _new(TtftPhases, (before, None, None, None, left, None, None, None))
    reported: list[int | None] = []
    for seconds in (load_s, queue_s, prefill_s):
        if seconds is None:
            reported.append(None)
            continue
        ns = min(max(round(seconds * 1e9), 0), left)
        reported.append(ns)
        left -= ns
    load, queue, prefill = reported
    return _new(TtftPhases, (before, load, queue, prefill, left, None, None, None))


_new = tuple.__new__
_MEASURED = (Phase.BEFORE_ENGINE, Phase.OTHER, Phase.REMOTE_PREFILL)
