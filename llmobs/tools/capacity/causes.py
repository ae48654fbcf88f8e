"""What bends the curve (pure): the sidecar's own phases and causes at the level that broke.

The client sees only that TTFT or TPOT grew; the sidecar saw where the time went. From its
/metrics read over the level (``Evidence``): the engine's queue against prefill in TTFT
(the phases, when the engine reports them; else its waiting gauge), the KV cache's fill,
preemptions, stalls by cause (another request's prefill, an engine pause) and, on a GPU,
the bandwidth used (MBU). One ``Cause`` with the figures that decided it, in a sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmobs.tools.capacity.figures import Level

PREEMPTIONS_PER_REQUEST = 0.02  # preempting one request in fifty bends a curve already
KV_FULL = 0.9  # the KV cache this full while requests wait: the cache, not the batch, limits
STALLS_PER_REQUEST = 0.5  # prefill stalls this frequent are what slows the stream
WAITING = 0.5  # requests waiting on average: a queue most of the time

# the causes, each with what it means for the operator
MEANINGS = {
    "errors": "requests failed",
    "preemption": "the KV cache filled mid-stream: requests were preempted and recomputed",
    "kv_capacity": "the KV cache, full, held requests in the queue before the batch was",
    "queue": "the batch was full: requests waited in the engine's queue",
    "prefill": "prompt processing: other requests' prefill ahead of each first token",
    "prefill_interference": "other requests' prefill paused running streams",
    "engine_pause": "the engine paused every stream (its own pauses, not the load's)",
    "decode": "the decode step grew with the batch (memory bandwidth: each token reads "
    "the weights and every sequence's KV cache)",
    "unknown": "the sidecar saw nothing that explains it (no engine gauges: --metrics-url, "
    "the engine collector)",
}


@dataclass(frozen=True)
class Evidence:
    """What the sidecar counted over one level (counter deltas; gauges' means and peaks)."""

    requests: float = 0.0  # the requests the sidecar timed over the level (all it saw)
    phases: Mapping[str, float] = field(default_factory=dict)  # mean TTFT seconds by phase
    stalls: Mapping[str, float] = field(default_factory=dict)  # stalls by cause
    preemptions: float = 0.0
    waiting: float | None = None  # the engine's queue, mean
    running: float | None = None  # the engine's batch, mean
    kv_usage: float | None = None  # the KV cache's fill, peak
    mbu: float | None = None  # the GPU's bandwidth used by decode, mean (a GPU only)


@dataclass(frozen=True)
class Cause:
    """Why a level broke its objectives: a name from ``MEANINGS`` and the figures."""

    name: str
    figures: str

    @property
    def says(self) -> str:
        return f"{self.name}: {MEANINGS[self.name]} ({self.figures})"


def _per(count: float, level: Level, ev: Evidence) -> float:
    """Per request the sidecar saw over the level (its warm-up and the requests that kept the
    load up count too: their stalls are in the deltas); the level's own count without it."""
    requests = ev.requests or level.requests
    return count / requests if requests else 0.0


def _ttft_cause(ev: Evidence) -> Cause:
    """Why TTFT grew: the queue (the batch's or the KV cache's) or prefill. The engine's
    queue time where it reports one (vLLM's, the sim's), else its waiting gauge (llama.cpp
    reports its prefill but not its queue: the rest of TTFT is not prefill, nor all queue)."""
    kv = f", KV cache {ev.kv_usage:.0%} full" if ev.kv_usage is not None else ""
    prefill = ev.phases.get("prefill", 0.0)
    if "queue" in ev.phases:
        queue = ev.phases["queue"]
        figures = f"mean queue {queue:.3f} s, prefill {prefill:.3f} s of TTFT{kv}"
        queued = queue >= prefill
    elif ev.waiting is not None:
        figures = f"{ev.waiting:.1f} requests waiting in the engine on average, prefill " \
            f"{prefill:.3f} s of TTFT{kv}"  # fmt: skip
        queued = ev.waiting >= WAITING
    else:
        return Cause("unknown", "the engine reports neither its queue time nor its queue")
    if not queued:
        return Cause("prefill", figures)
    full = ev.kv_usage is not None and ev.kv_usage >= KV_FULL
    return Cause("kv_capacity" if full else "queue", figures)


def _stream_cause(level: Level, ev: Evidence) -> Cause:
    """Why the stream slowed: prefill pausing it, engine pauses, or the decode step."""
    prefill = _per(ev.stalls.get("prefill", 0.0), level, ev)
    pauses = _per(ev.stalls.get("engine_pause", 0.0), level, ev)
    figures = f"{prefill:.2f} prefill and {pauses:.2f} engine stalls per request"
    if prefill >= STALLS_PER_REQUEST and prefill >= pauses:
        return Cause("prefill_interference", figures)
    if pauses >= STALLS_PER_REQUEST:
        return Cause("engine_pause", figures)
    batch = f"; batch {ev.running:.1f}" if ev.running is not None else ""
    mbu = f"; MBU {ev.mbu:.0%}" if ev.mbu is not None else ""
    return Cause("decode", f"{figures}{batch}{mbu}")


def explain(level: Level, ev: Evidence) -> Cause:
    """The cause of ``level``'s misses (``level.misses``), from ``ev``."""
    if level.overloaded:
        return Cause("queue", f"arrivals outpaced the engine: {level.overloaded} requests "
                     "not sent, too many in flight already")  # fmt: skip
    if "errors" in level.misses:
        return Cause("errors", f"{level.errors} of {level.requests} requests failed")
    preempted = _per(ev.preemptions, level, ev)
    if preempted >= PREEMPTIONS_PER_REQUEST:
        kv = f", KV cache {ev.kv_usage:.0%} full" if ev.kv_usage is not None else ""
        return Cause("preemption", f"{preempted:.2f} preemptions per request{kv}")
    if "ttft" in level.misses:
        return _ttft_cause(ev)
    if "tpot" in level.misses or "max_gap" in level.misses:
        return _stream_cause(level, ev)
    return Cause("unknown", "no objective missed")
