"""The engine collector: scrape the engine's own /metrics and re-export its queue and cache.

Every ``--engine-scrape-interval`` seconds it GETs ``--engine-metrics-url`` (the upstream's
``/metrics`` by default), recognises the engine from the metric names (``ENGINES``) and keeps
three numbers under uniform names with an ``engine`` label: requests waiting, requests
running, KV-cache usage (0-1). Counts are summed over the engine's label sets (models,
data-parallel ranks); the usage ratio is their mean.

Only lines that name a mapped metric are parsed (with ``prometheus_client``'s parser, one
line at a time, in a worker thread): an engine's exposition can be large, and a malformed
line costs only itself. An engine that is not up yet, or has no /metrics, or no known
metrics, leaves the collector down (logged once, with the reason); the first scrape is at
start. Triton publishes its metrics on a port of their own (8002): point
``--engine-metrics-url`` there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from prometheus_client.parser import text_string_to_metric_families

from llmobs.collectors.base import PollingCollector, Unavailable
from llmobs.export.metrics import catalogue as m
from llmobs.observe.labels import bounded
from llmobs.wire.tls import EngineTls

Callback = Callable[[CallbackOptions], Iterable[Observation]]
MAX_BYTES = 16 * 1024**2  # a larger exposition is refused (an error)
MAX_MODELS_BYTES = 1024**2  # a model list larger than this is not read
MAX_ADAPTERS = 64  # adapters labelled at most (the engine's configuration, not clients')
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Series:
    """A metric name, and where the engine files several numbers under it (Triton), the one
    label value that picks this number."""

    name: str
    label: str = ""
    value: str = ""

    def picks(self, labels: dict[str, str]) -> bool:
        return not self.label or labels.get(self.label) == self.value


@dataclass(frozen=True)
class EngineSpec:
    """An engine's metrics for each uniform number; the first one present wins. ``kv_blocks``
    (used, total) gives the KV-cache usage where no ratio of it is published."""

    engine: str
    waiting: tuple[Series, ...] = ()
    running: tuple[Series, ...] = ()
    kv_usage: tuple[Series, ...] = ()
    kv_blocks: tuple[Series, Series] | None = None
    preemptions: tuple[Series, ...] = ()  # a counter of requests preempted (stall causes)
    # the prefix cache (counters of prompt tokens, or a ratio) and speculative decoding
    prefix_hits: tuple[Series, ...] = ()
    prefix_queries: tuple[Series, ...] = ()
    prefix_ratio: tuple[Series, ...] = ()
    spec_accepted: tuple[Series, ...] = ()
    spec_drafted: tuple[Series, ...] = ()
    provider: str = ""  # its gen_ai.provider.name where it is not ``engine``

    @property
    def series(self) -> tuple[Series, ...]:
        return (*self.waiting, *self.running, *self.kv_usage, *(self.kv_blocks or ()),
                *self.preemptions, *self.prefix_hits, *self.prefix_queries, *self.prefix_ratio,
                *self.spec_accepted, *self.spec_drafted)  # fmt: skip


def _names(*names: str) -> tuple[Series, ...]:
    return tuple(Series(name) for name in names)


def _triton(kind: str, value: str) -> Series:
    """One of the TensorRT-LLM backend's numbers in Triton's /metrics, by its label value
    (triton_backend custom_metrics_reporter.cc)."""
    return Series(f"nv_trt_llm_{kind}_metrics", f"{kind}_type", value)


ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec(
        "vllm",
        _names("vllm:num_requests_waiting"),
        _names("vllm:num_requests_running"),
        # a 0-1 ratio despite "perc"
        _names("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        preemptions=_names("vllm:num_preemptions_total"),
        prefix_hits=_names("vllm:prefix_cache_hits_total"),
        prefix_queries=_names("vllm:prefix_cache_queries_total"),
        prefix_ratio=_names("vllm:gpu_prefix_cache_hit_rate"),  # V0's
        spec_accepted=_names("vllm:spec_decode_num_accepted_tokens_total"),
        spec_drafted=_names("vllm:spec_decode_num_draft_tokens_total"),
    ),
    EngineSpec(
        "sglang",
        _names("sglang:num_queue_reqs"),
        _names("sglang:num_running_reqs"),
        _names("sglang:token_usage"),
        # a retraction is SGLang's preemption (``num_retracted_reqs`` is a gauge of deltas)
        preemptions=_names("sglang:num_retracted_requests_total"),
        prefix_ratio=_names("sglang:cache_hit_rate"),
    ),
    EngineSpec("tgi", _names("tgi_queue_size"), _names("tgi_batch_current_size")),
    # llama-server's own /metrics has no KV-cache gauge; older builds had the ratio
    EngineSpec(
        "llamacpp",
        _names("llamacpp:requests_deferred"),
        _names("llamacpp:requests_processing"),
        _names("llamacpp:kv_cache_usage_ratio"),
        provider="llama_cpp",
    ),
    # trtllm-serve (tensorrt_llm/metrics/collector.py; NVIDIA Dynamo 0.7 wrote trtllm:)
    EngineSpec(
        "trtllm",
        _names("trtllm_num_requests_waiting", "trtllm:num_requests_waiting"),
        _names("trtllm_num_requests_running"),
        _names("trtllm_kv_cache_utilization", "trtllm:kv_cache_utilization"),
        provider="tensorrt_llm",
    ),
    # Triton with the TensorRT-LLM backend (its "waiting": active but not scheduled), else
    # Triton's own queue of requests not yet handed to a model
    EngineSpec(
        "triton",
        (_triton("request", "waiting"), Series("nv_inference_pending_request_count")),
        (_triton("request", "scheduled"),),
        (_triton("kv_cache_block", "fraction"),),
        (_triton("kv_cache_block", "used"), _triton("kv_cache_block", "max")),
    ),
)
_KNOWN = frozenset(series.name for spec in ENGINES for series in spec.series)
# each engine as the GenAI conventions' gen_ai.provider.name calls it (observe.provider):
# the engine label's value where no other spelling is in use
PROVIDERS = {spec.engine: spec.provider or spec.engine for spec in ENGINES}


@dataclass(frozen=True)
class EngineReading:
    engine: str
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None  # the engine's preemption counter, summed
    adapters: tuple[tuple[str, str], ...] = ()  # (LoRA adapter, its base model), /v1/models
    prefix_hits: float | None = None  # prompt tokens found in the prefix cache (a counter)
    prefix_queries: float | None = None  # ... looked up in it (a counter)
    prefix_hit_ratio: float | None = None  # where the engine gives only a ratio (mean)
    spec_accepted: float | None = None  # draft tokens accepted (a counter)
    spec_drafted: float | None = None  # draft tokens proposed (a counter)


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _name(line: str) -> str:
    """The metric name a sample line starts with."""
    end = len(line)
    for sep in ("{", " ", "\t"):
        i = line.find(sep)
        if 0 <= i < end:
            end = i
    return line[:end]


def samples(text: str, names: frozenset[str] = _KNOWN) -> Samples:
    """The labels and value of each sample named in ``names``; malformed lines and NaNs are
    skipped."""
    out: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or _name(line) not in names:
            continue
        try:
            parsed = [s for f in text_string_to_metric_families(line + "\n") for s in f.samples]
        except (ValueError, IndexError, TypeError):
            continue
        for s in parsed:
            if s.name in names and not math.isnan(s.value):
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _values(found: Samples, series: Series) -> list[float]:
    return [value for labels, value in found.get(series.name, ()) if series.picks(labels)]


def _first(found: Samples, choices: tuple[Series, ...]) -> list[float] | None:
    return next((v for v in (_values(found, s) for s in choices) if v), None)


def read_engine(text: str) -> EngineReading | None:
    """The engine whose metrics ``text`` holds most of, and its three numbers; None if none.
    Counts are summed over label sets (models, ranks); a ratio is their mean."""
    found = samples(text)
    best = max(ENGINES, key=lambda spec: sum(bool(_values(found, s)) for s in spec.series))
    if not any(_values(found, s) for s in best.series):
        return None
    waiting, running = _first(found, best.waiting), _first(found, best.running)
    usage = _first(found, best.kv_usage)
    kv = sum(usage) / len(usage) if usage else None
    if kv is None and best.kv_blocks is not None:
        used, total = (sum(_values(found, s)) for s in best.kv_blocks)
        kv = used / total if total > 0 else None
    ratio = _first(found, best.prefix_ratio)
    return EngineReading(
        best.engine,
        sum(waiting) if waiting else None,
        sum(running) if running else None,
        kv,
        _sum(found, best.preemptions),
        prefix_hits=_sum(found, best.prefix_hits),
        prefix_queries=_sum(found, best.prefix_queries),
        prefix_hit_ratio=sum(ratio) / len(ratio) if ratio else None,
        spec_accepted=_sum(found, best.spec_accepted),
        spec_drafted=_sum(found, best.spec_drafted),
    )


def _sum(found: Samples, choices: tuple[Series, ...]) -> float | None:
    """A counter summed over its label sets (models, ranks); None when absent."""
    values = _first(found, choices)
    return sum(values) if values else None


class EngineCollector(PollingCollector[EngineReading]):
    """Scrapes ``url`` every ``interval`` seconds; ``snapshot`` holds the last reading."""

    def __init__(
        self,
        url: str,
        interval: float = 5.0,
        *,
        first_delay: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_preemptions: Callable[[int, int, float], None] | None = None,
        models_url: str = "",
        on_engine: Callable[[str | None], None] | None = None,
        tls: EngineTls | None = None,
    ) -> None:
        """``on_preemptions(sent_ns, read_ns, total)``: each scrape's preemption counter,
        with when it was asked and read (``perf_counter_ns``, the relay's clock): the stall
        causes' (``observe.causes.EngineTimeline.preemptions``). ``models_url``: the engine's
        OpenAI model list, read for the LoRA adapters it serves and their base models (best
        effort: an engine without one, or without parents in it, has none).
        ``on_engine(name)``: the engine each scrape names, as a provider name (``PROVIDERS``),
        or None when the endpoint answers but names no known engine (no /metrics, or another
        program's): the provider name's (``observe.provider``). ``tls``: how an https
        engine is asked (the sidecar's context for it, and the name its certificate carries)."""
        # at start by default: a pod just started shows its engine at once (up, or down with
        # the reason) instead of absent for a whole interval
        delay = 0.0 if first_delay is None else first_delay
        super().__init__("engine", interval, first_delay=delay, clock=clock)
        self.url = url
        self.on_preemptions = on_preemptions
        self.on_engine = on_engine
        self.models_url = models_url
        self._session: aiohttp.ClientSession | None = None
        self._tls = tls

    def _tls_for(self, url: str) -> dict[str, Any]:
        return self._tls.request_args(url) if self._tls is not None else {}

    async def poll(self) -> EngineReading:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=min(max(self.interval, 1.0), TIMEOUT_S))
        sent = time.perf_counter_ns()
        try:
            async with self._session.get(
                self.url, timeout=timeout, **self._tls_for(self.url)
            ) as resp:
                if resp.status != 200:
                    if resp.status < 500:  # no metrics here (a 5xx: not up yet, maybe)
                        self._named(None)
                    raise Unavailable(f"{self.url} answered {resp.status}")
                if resp.content_type == "application/json":
                    # trtllm-serve's /metrics: iteration stats, each read only once (reading
                    # them takes them from other readers); its Prometheus page is elsewhere
                    raise Unavailable(
                        f"{self.url} answered JSON, not Prometheus text (trtllm-serve: set "
                        "--engine-metrics-url to its /prometheus/metrics)"
                    )
                body = await _read_bounded(resp)
        except aiohttp.ClientConnectorError as exc:
            raise Unavailable(f"{self.url} unreachable ({type(exc).__name__})") from exc
        read = time.perf_counter_ns()
        text = body.decode("utf-8", errors="replace")
        reading = await asyncio.to_thread(read_engine, text)
        self._named(None if reading is None else reading.engine)
        if reading is None:
            raise Unavailable(f"no known engine metrics at {self.url}")
        if reading.preemptions is not None and self.on_preemptions is not None:
            self.on_preemptions(sent, read, reading.preemptions)
        if self.models_url:
            reading = dataclasses.replace(reading, adapters=await self._adapters(timeout))
        return reading

    def _named(self, engine: str | None) -> None:
        if self.on_engine is not None:
            self.on_engine(None if engine is None else PROVIDERS[engine])

    async def _adapters(self, limit: aiohttp.ClientTimeout) -> tuple[tuple[str, str], ...]:
        """The adapters /v1/models lists with a parent (vLLM's, SGLang's); none when it
        cannot be read: the model list is a nicety, not what the collector is up for."""
        assert self._session is not None
        try:
            tls = self._tls_for(self.models_url)
            async with self._session.get(self.models_url, timeout=limit, **tls) as resp:
                if resp.status != 200:
                    return ()
                body = await _read_bounded(resp, MAX_MODELS_BYTES)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return ()
        return adapters_of(body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int = MAX_BYTES) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(65536):
        size += len(chunk)
        if size > limit:
            raise ValueError(f"an engine answer larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def adapters_of(body: bytes) -> tuple[tuple[str, str], ...]:
    """(adapter, base model) for each model an OpenAI model list gives a ``parent`` other
    than itself (vLLM's LoRA adapters), the first ``MAX_ADAPTERS``; none from anything else."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return ()
    if not isinstance(data, list):
        return ()
    found = []
    for card in data:
        if not isinstance(card, dict):
            continue
        name, parent = card.get("id"), card.get("parent")
        if isinstance(name, str) and isinstance(parent, str) and parent and parent != name:
            adapter, base = bounded(name), bounded(parent)
            if adapter is not None and base is not None:  # labels: valid Unicode, bounded
                found.append((adapter, base))
    return tuple(found[:MAX_ADAPTERS])


def register_engine(meter: Meter, collector: EngineCollector) -> None:
    """The uniform engine gauges and counters, reading the last snapshot."""

    def reads(value: Callable[[EngineReading], float | None]) -> Callback:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            reading = collector.snapshot
            v = value(reading) if reading is not None else None
            if reading is None or v is None:
                return []
            return [Observation(v, {m.ENGINE: reading.engine})]

        return observe

    for metric, value in (
        (m.ENGINE_WAITING, lambda r: r.waiting), (m.ENGINE_RUNNING, lambda r: r.running),
        (m.ENGINE_KV_CACHE, lambda r: r.kv_usage),
        (m.ENGINE_PREFIX_RATIO, lambda r: r.prefix_hit_ratio),
    ):  # fmt: skip
        meter.create_observable_gauge(
            metric.name, [reads(value)], unit=metric.unit, description=metric.description
        )
    # the engine's counters as it reads them (one restarts with the engine: rate() takes
    # that as a reset)
    for metric, value in (
        (m.ENGINE_PREEMPTIONS, lambda r: r.preemptions),
        (m.ENGINE_PREFIX_HITS, lambda r: r.prefix_hits),
        (m.ENGINE_PREFIX_QUERIES, lambda r: r.prefix_queries),
        (m.ENGINE_SPEC_ACCEPTED, lambda r: r.spec_accepted),
        (m.ENGINE_SPEC_DRAFTED, lambda r: r.spec_drafted),
    ):  # fmt: skip
        meter.create_observable_counter(
            metric.name, [reads(value)], unit=metric.unit, description=metric.description
        )

    def adapters(options: CallbackOptions) -> Iterable[Observation]:
        reading = collector.snapshot
        if reading is None:
            return []
        return [Observation(1, {m.MODEL: name, m.BASE_MODEL: base})
                for name, base in reading.adapters]  # fmt: skip

    info = m.MODEL_INFO
    meter.create_observable_gauge(
        info.name, [adapters], unit=info.unit, description=info.description
    )
