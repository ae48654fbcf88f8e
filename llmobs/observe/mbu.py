"""MBU and MFU: how much of the GPU's memory bandwidth decode uses, and of its FLOPs prefill.

Pure arithmetic over finished-request records: no clock (``now`` is an argument), no
telemetry. The formulas and every assumption are in docs/gpu.md; in short:

- **MBU** (Databricks/MosaicML): bytes read per decode step / time per step / peak bandwidth.
  A decode step reads every weight once plus the KV cache of every sequence in the batch:
  ``weight_bytes + kv_bytes_per_token x tokens_in_flight``. The step time is the TPOT the
  sidecar measured, averaged over decode steps. Tokens in flight come from Little's law over
  the requests that ended in the window: each request decodes for ``tpot x (output - 1)``
  seconds with on average ``prompt + output / 2`` tokens in its cache; the sum of those
  token-seconds over the time at least one request was decoding is the mean number of tokens
  whose KV cache a step reads.
- **MFU** of prefill: ``2 x params x prompt tokens / prefill time / peak FLOP/s``, summed
  over the window's requests (prefill time: the engine's own figure when it reports one,
  else TTFT, which includes queueing: a lower bound).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from llmobs.config.model import DTYPE_BYTES

if TYPE_CHECKING:
    from llmobs.observe.timing import RequestStats

WINDOW_S = 60.0  # requests that ended this long ago still count
MAX_RECORDS = 4096  # per model and phase: bounds memory and the scrape's work


def weight_bytes(params: float, dtype: str) -> float:
    """Bytes of ``params`` weights stored as ``dtype``."""
    return params * DTYPE_BYTES[dtype]


def kv_element_bytes(kv_dtype: str, weight_dtype: str) -> float:
    """Bytes per KV-cache element; ``auto`` is the model's activation dtype, as in vLLM:
    the weight dtype when it is 16 or 32 bits, else 16 bits (quantized weights still
    compute, and cache, in fp16/bf16)."""
    if kv_dtype != "auto":
        return DTYPE_BYTES[kv_dtype]
    return max(DTYPE_BYTES[weight_dtype], 2.0)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_bytes: float) -> float:
    """KV-cache bytes of one token: a key and a value per layer and KV head."""
    return 2.0 * layers * kv_heads * head_dim * element_bytes


@dataclass(frozen=True)
class ModelShape:
    """What MBU and MFU need to know of the model; None where not configured."""

    weight_bytes: float | None = None  # read once per decode step
    params: float | None = None  # for prefill FLOPs
    kv_bytes_per_token: float | None = None

    @classmethod
    def of(
        cls,
        *,
        model_bytes: float | None,
        model_params: float | None,
        weight_dtype: str,
        layers: int = 0,
        kv_heads: int = 0,
        head_dim: int = 0,
        kv_dtype: str = "auto",
    ) -> ModelShape:
        """From the settings: bytes given, else params x dtype size; params given, else
        bytes / dtype size; the KV term only when layers, KV heads and head dim are all given."""
        size = DTYPE_BYTES[weight_dtype]
        wbytes = model_bytes or (model_params * size if model_params else None)
        params = model_params or (model_bytes / size if model_bytes else None)
        kv = None
        if layers and kv_heads and head_dim:
            element = kv_element_bytes(kv_dtype, weight_dtype)
            kv = kv_bytes_per_token(layers, kv_heads, head_dim, element)
        return cls(wbytes, params, kv)

    def bytes_per_step(self, kv_tokens: float) -> float | None:
        """Bytes one decode step reads with ``kv_tokens`` tokens in the batch's caches."""
        if self.weight_bytes is None:
            return None
        return self.weight_bytes + (self.kv_bytes_per_token or 0.0) * kv_tokens


def mbu(bytes_per_step: float, step_s: float, peak_bandwidth: float) -> float:
    """Model bandwidth utilization: achieved bytes/s of decode over the peak."""
    return bytes_per_step / step_s / peak_bandwidth


def mfu(params: float, prompt_tokens: float, prefill_s: float, peak_flops: float) -> float:
    """Model FLOPs utilization of prefill: 2 FLOPs per parameter per prompt token."""
    return 2.0 * params * prompt_tokens / prefill_s / peak_flops


class Decode(NamedTuple):
    """The decode phase of one finished request (a named tuple: docs/architecture.md, "Records
    are named tuples")."""

    end: float  # when the request was recorded (the tracker's clock)
    seconds: float  # tpot x steps
    steps: int  # output tokens - 1
    context: float  # mean tokens in its KV cache during decode: prompt + output / 2


class Prefill(NamedTuple):
    """The prefill phase of one finished request (a named tuple, as ``Decode``)."""

    end: float
    prompt_tokens: int
    seconds: float


@dataclass(frozen=True)
class DecodeEstimate:
    step_s: float  # mean time per decode step (TPOT weighted by steps)
    kv_tokens: float  # mean tokens whose KV cache a step reads
    requests: int


@dataclass(frozen=True)
class PrefillEstimate:
    prompt_tokens: float
    seconds: float
    requests: int


def busy_time(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def decode_estimate(records: Iterable[Decode]) -> DecodeEstimate | None:
    """Step time and tokens in flight over ``records`` (Little's law over the busy time)."""
    recs = [r for r in records if r.seconds > 0 and r.steps > 0]
    if not recs:
        return None
    seconds = sum(r.seconds for r in recs)
    steps = sum(r.steps for r in recs)
    busy = busy_time((r.end - r.seconds, r.end) for r in recs)
    kv_tokens = sum(r.seconds * r.context for r in recs) / busy
    return DecodeEstimate(seconds / steps, kv_tokens, len(recs))


def prefill_estimate(records: Iterable[Prefill]) -> PrefillEstimate | None:
    recs = [r for r in records if r.seconds > 0]
    if not recs:
        return None
    return PrefillEstimate(
        sum(r.prompt_tokens for r in recs), sum(r.seconds for r in recs), len(recs)
    )


R = TypeVar("R", Decode, Prefill)


class EfficiencyTracker:
    """Per model, the decode and prefill phases of the requests that ended in the window.

    ``record`` runs on the event loop once per finished request (a few appends); the
    estimates run at scrape time in the rendering thread, hence the lock.
    """

    def __init__(self, window_s: float = WINDOW_S, max_records: int = MAX_RECORDS) -> None:
        self.window_s = window_s
        self._max = max_records
        self._decode: dict[str, deque[Decode]] = {}
        self._prefill: dict[str, deque[Prefill]] = {}
        self._lock = threading.Lock()

    def record(self, model: str, s: RequestStats, now: float) -> None:
        """Keep what MBU/MFU need of a finished request (labels already bounded)."""
        decode = prefill = None
        if s.tpot_s is not None and s.output_tokens >= 2:
            steps = s.output_tokens - 1
            context = (s.input_tokens or 0) + s.output_tokens / 2
            decode = Decode(now, s.tpot_s * steps, steps, context)
        prefill_s = s.engine_prompt_eval_s if s.engine_prompt_eval_s is not None else s.ttft_s
        # the prompt tokens the engine computed: a prefix found in its cache was not
        computed = (s.input_tokens or 0) - (s.cached_tokens or 0)
        if computed > 0 and prefill_s:
            prefill = Prefill(now, computed, prefill_s)
        if decode is None and prefill is None:
            return
        with self._lock:
            if decode is not None:  # (an empty queue is falsy: _queue returns that one)
                (self._decode.get(model) or self._queue(self._decode, model)).append(decode)
            if prefill is not None:
                (self._prefill.get(model) or self._queue(self._prefill, model)).append(prefill)

    def _queue(self, by_model: dict[str, deque[R]], model: str) -> deque[R]:
        queue = by_model.get(model)
        if queue is None:
            queue = by_model[model] = deque(maxlen=self._max)
        return queue

    def decode(self, now: float) -> dict[str, DecodeEstimate]:
        """Per model, the decode estimate over the requests that ended in the window."""
        with self._lock:
            recent = self._recent(self._decode, now)
        out = {m: decode_estimate(recs) for m, recs in recent.items()}
        return {m: e for m, e in out.items() if e is not None}

    def prefill(self, now: float) -> dict[str, PrefillEstimate]:
        with self._lock:
            recent = self._recent(self._prefill, now)
        out = {m: prefill_estimate(recs) for m, recs in recent.items()}
        return {m: e for m, e in out.items() if e is not None}

    def _recent(self, by_model: dict[str, deque[R]], now: float) -> dict[str, list[R]]:
        """Drop records older than the window; copies of what is left (under the lock)."""
        horizon = now - self.window_s
        for model in list(by_model):
            queue = by_model[model]
            while queue and queue[0].end < horizon:
                queue.popleft()
            if not queue:
                del by_model[model]
        return {m: list(q) for m, q in by_model.items()}
