"""The one catalogue of metrics: every name, unit, bucket set and label set is defined here.

Dashboards, alert rules and docs/metrics.md are tested against ``CATALOGUE``. Names follow the
OpenTelemetry GenAI semantic conventions where one exists (``gen_ai.server.*``,
``gen_ai.client.token.usage`` with ``gen_ai.token.type``) and ``llmobs.*`` otherwise; the
OpenTelemetry Prometheus exporter turns them into Prometheus names (dots to underscores, the
unit as a suffix, ``_total`` on counters), which ``MetricDef.prometheus`` spells out.

Buckets are chosen for LLM latencies, never the SDK defaults: ITL needs resolution from 1 ms
(speculative decoding on an H100) to seconds (a stalled CPU engine); TTFT from 10 ms to minutes
(a long queue).

Recording does not go through the OpenTelemetry SDK: a ``Histogram.record`` costs ~9 us and a
request needs ten, and the SDK's Prometheus exporter rebuilds every family at each scrape.
``MetricsSink`` keeps each series in plain Python (``llmobs.series``) and exposes them from the
sidecar's Prometheus registry with the exposition the exporter produced (names, types, labels,
buckets); the per-token ITL histogram is binned a window at a time (``TokenHistogram``),
together with the sum of squares that makes ITL variance aggregable across pods. A request's
series are found once per label set (``_LabelSet``), so recording one is a few list updates
under one lock. When metrics are also pushed
over OTLP, request-level metrics are recorded into OpenTelemetry instruments as well
(``OtelInstruments``).
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from opentelemetry.metrics import Counter, Histogram, Meter
from prometheus_client import CollectorRegistry

from llmobs.labels import UNKNOWN, BoundedLabel
from llmobs.series import CounterFamily, HistogramFamily, Number, SeriesCollector
from llmobs.stats import TokenWindow
from llmobs.timing import StreamStats, TokenSource


class Kind(enum.StrEnum):
    COUNTER = "counter"
    UPDOWN = "updowncounter"  # exported to Prometheus as a gauge
    HISTOGRAM = "histogram"
    TOKEN_HISTOGRAM = "token_histogram"  # bulk-recorded histogram, see module docstring
    GAUGE = "gauge"  # observable gauge: a background collector's snapshot, read at scrape


# Label (attribute) names. GenAI names where the conventions define one.
OPERATION = "gen_ai.operation.name"
MODEL = "gen_ai.request.model"
TOKEN_TYPE = "gen_ai.token.type"
OUTCOME = "outcome"
STATUS_CLASS = "status_class"
FINISH_REASON = "finish_reason"
TOKEN_SOURCE = "token_count_source"

_OP_MODEL = (OPERATION, MODEL)

_UNIT_SUFFIX = {
    "s": "_seconds", "By": "_bytes", "By/s": "_bytes_per_second", "W": "_watts",
    "Cel": "_celsius", "Hz": "_hertz",
}  # fmt: skip

LATENCY_BUCKETS = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025,
    0.03, 0.035, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0,
    5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0,
    120.0, 180.0, 300.0, 600.0,
)  # fmt: skip
SMOOTHNESS_BUCKETS = (
    0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 0.999, 1.0,
)  # fmt: skip
TOKEN_BUCKETS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0)


@dataclass(frozen=True)
class MetricDef:
    """One metric: OpenTelemetry instrument name, kind, UCUM unit, labels, buckets."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def prometheus(self) -> str:
        """The Prometheus family name as exposed on /metrics (without _bucket/_sum/...)."""
        base = self.name.replace(".", "_") + _UNIT_SUFFIX.get(self.unit, "")
        if self.unit == "s2":
            base = self.name.replace(".", "_") + "_seconds_squared"
        return base + "_total" if self.kind is Kind.COUNTER else base

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        return tuple(label.replace(".", "_") for label in self.labels)


TTFT = MetricDef(
    "gen_ai.server.time_to_first_token", Kind.HISTOGRAM, "s",
    "Time from the request reaching the sidecar to the first output token relayed.",
    _OP_MODEL, TTFT_BUCKETS,
)  # fmt: skip
TPOT = MetricDef(
    "gen_ai.server.time_per_output_token", Kind.HISTOGRAM, "s",
    "Per request: (last token time - first token time) / (output tokens - 1).",
    _OP_MODEL, LATENCY_BUCKETS,
)  # fmt: skip
DURATION = MetricDef(
    "gen_ai.server.request.duration", Kind.HISTOGRAM, "s",
    "Time from the request reaching the sidecar to the end of its response.",
    _OP_MODEL, DURATION_BUCKETS,
)  # fmt: skip
TOKEN_USAGE = MetricDef(
    "gen_ai.client.token.usage", Kind.HISTOGRAM, "{token}",
    "Input and output tokens per request (engine usage when reported, else counted chunks).",
    (*_OP_MODEL, TOKEN_TYPE), TOKEN_BUCKETS,
)  # fmt: skip
ITL = MetricDef(
    "llmobs.inter_token_latency", Kind.TOKEN_HISTOGRAM, "s",
    "Gap between output chunks divided among the chunk's tokens, observed once per token.",
    _OP_MODEL, LATENCY_BUCKETS,
)  # fmt: skip
ITL_SQUARES = MetricDef(
    "llmobs.inter_token_latency", Kind.COUNTER, "s2",
    "Sum of squared per-token ITLs: with the ITL histogram's _sum and _count, variance.",
    _OP_MODEL,
)  # fmt: skip
STALLS = MetricDef(
    "llmobs.stalls", Kind.COUNTER, "{stall}",
    "Gaps between output chunks >= stall factor x the request's median gap and >= min gap.",
    _OP_MODEL,
)  # fmt: skip
SMOOTHNESS = MetricDef(
    "llmobs.smoothness", Kind.HISTOGRAM, "1",
    "Per request 1/(1+CV^2) of per-token ITLs: 1 = perfectly steady, lower = stutter.",
    _OP_MODEL, SMOOTHNESS_BUCKETS,
)  # fmt: skip
REQUESTS = MetricDef(
    "llmobs.requests", Kind.COUNTER, "{request}",
    "Proxied requests by outcome, HTTP status class of the response and finish reason.",
    (*_OP_MODEL, OUTCOME, STATUS_CLASS, FINISH_REASON),
)  # fmt: skip
TOKENS = MetricDef(
    "llmobs.tokens", Kind.COUNTER, "{token}",
    "Tokens by type (input, output, reasoning within output, cached_input within input) and "
    "by where the count came from (the engine's usage, or counted chunks).",
    (*_OP_MODEL, TOKEN_TYPE, TOKEN_SOURCE),
)  # fmt: skip
ENGINE_PROMPT_EVAL = MetricDef(
    "llmobs.engine.prompt_eval.duration", Kind.HISTOGRAM, "s",
    "Prefill time as the engine itself reports it (Ollama prompt_eval_duration).",
    _OP_MODEL, TTFT_BUCKETS,
)  # fmt: skip
ENGINE_LOAD = MetricDef(
    "llmobs.engine.load.duration", Kind.HISTOGRAM, "s",
    "Model load time the engine reports for the request (Ollama load_duration).",
    _OP_MODEL, TTFT_BUCKETS,
)  # fmt: skip
ACTIVE = MetricDef(
    "llmobs.requests.active", Kind.UPDOWN, "{request}",
    "Requests in flight through the sidecar (streaming or not).",
)  # fmt: skip
QUEUE_DEPTH = MetricDef(
    "llmobs.prefill.queue_depth", Kind.UPDOWN, "{request}",
    "Requests forwarded upstream that have not produced their first token yet.",
)  # fmt: skip
MALFORMED = MetricDef(
    "llmobs.stream.malformed_events", Kind.COUNTER, "{event}",
    "Stream events that could not be parsed (relayed unchanged, not timed).",
)  # fmt: skip
OBSERVER_ERRORS = MetricDef(
    "llmobs.observer.errors", Kind.COUNTER, "{error}",
    "Internal errors while observing a request; the relay carried on.",
)  # fmt: skip

SPANS_DROPPED = MetricDef(
    "llmobs.spans.dropped", Kind.COUNTER, "{span}",
    "Spans dropped because the trace export queue was full (exported only when tracing is on).",
)  # fmt: skip

# Collectors (llmobs/collectors): polled in the background, exported as observable
# instruments that read the last snapshot at scrape time. See docs/gpu.md.
COLLECTOR = "collector"
GPU_LABELS = ("gpu", "uuid", "name")
BANDWIDTH_SOURCE = "source"
ENGINE = "engine"

COLLECTOR_UP = MetricDef(
    "llmobs.collector.up", Kind.GAUGE, "1",
    "1 when the collector's last poll read something, 0 when it is down (no GPU, no engine "
    "metrics, an error).",
    (COLLECTOR,),
)  # fmt: skip
COLLECTOR_DURATION = MetricDef(
    "llmobs.collector.scrape.duration", Kind.GAUGE, "s",
    "How long the collector's last poll took.",
    (COLLECTOR,),
)  # fmt: skip
COLLECTOR_ERRORS = MetricDef(
    "llmobs.collector.errors", Kind.COUNTER, "{error}",
    "Unexpected failures of a collector: failed polls, and reads of one GPU or one field that "
    "failed while the others went on. An absent device or engine is not an error.",
    (COLLECTOR,),
)  # fmt: skip
GPU_MEMORY_USED = MetricDef(
    "llmobs.gpu.memory.used", Kind.GAUGE, "By", "GPU memory in use (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_FREE = MetricDef(
    "llmobs.gpu.memory.free", Kind.GAUGE, "By", "GPU memory free (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_TOTAL = MetricDef(
    "llmobs.gpu.memory.total", Kind.GAUGE, "By", "GPU memory in total (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_RESERVED = MetricDef(
    "llmobs.gpu.memory.reserved", Kind.GAUGE, "By",
    "GPU memory reserved by the driver and firmware (NVML memory info v2).", GPU_LABELS,
)  # fmt: skip
GPU_UTILIZATION = MetricDef(
    "llmobs.gpu.utilization", Kind.GAUGE, "1",
    "Fraction of the last sample period in which a kernel ran on the GPU (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_MEMORY_CONTROLLER = MetricDef(
    "llmobs.gpu.memory_controller.utilization", Kind.GAUGE, "1",
    "Fraction of the last sample period in which device memory was read or written (NVML).",
    GPU_LABELS,
)  # fmt: skip
GPU_BANDWIDTH_UTILIZATION = MetricDef(
    "llmobs.gpu.memory.bandwidth.utilization", Kind.GAUGE, "1",
    "DRAM bandwidth used / peak: NVML GPM DRAM_BW_UTIL (source=gpm, Hopper and newer), else "
    "the memory-controller busy ratio (source=mem_util, an upper bound).",
    (*GPU_LABELS, BANDWIDTH_SOURCE),
)  # fmt: skip
GPU_BANDWIDTH = MetricDef(
    "llmobs.gpu.memory.bandwidth", Kind.GAUGE, "By/s",
    "Achieved DRAM bandwidth: the bandwidth utilization x the peak bandwidth.",
    (*GPU_LABELS, BANDWIDTH_SOURCE),
)  # fmt: skip
GPU_BANDWIDTH_PEAK = MetricDef(
    "llmobs.gpu.memory.bandwidth.peak", Kind.GAUGE, "By/s",
    "Peak DRAM bandwidth: max memory clock x bus width x 2 (NVML), or --gpu-peak-bandwidth.",
    GPU_LABELS,
)  # fmt: skip
GPU_POWER = MetricDef(
    "llmobs.gpu.power", Kind.GAUGE, "W", "Power draw (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_TEMPERATURE = MetricDef(
    "llmobs.gpu.temperature", Kind.GAUGE, "Cel", "GPU die temperature (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_CLOCK_SM = MetricDef(
    "llmobs.gpu.clock.sm", Kind.GAUGE, "Hz", "Current SM clock (NVML).", GPU_LABELS,
)  # fmt: skip
GPU_CLOCK_MEMORY = MetricDef(
    "llmobs.gpu.clock.memory", Kind.GAUGE, "Hz", "Current memory clock (NVML).", GPU_LABELS,
)  # fmt: skip
ENGINE_WAITING = MetricDef(
    "llmobs.engine.requests.waiting", Kind.GAUGE, "{request}",
    "Requests waiting in the engine's queue, from the engine's own /metrics.",
    (ENGINE,),
)  # fmt: skip
ENGINE_RUNNING = MetricDef(
    "llmobs.engine.requests.running", Kind.GAUGE, "{request}",
    "Requests in the engine's running batch, from the engine's own /metrics.",
    (ENGINE,),
)  # fmt: skip
ENGINE_KV_CACHE = MetricDef(
    "llmobs.engine.kv_cache.usage", Kind.GAUGE, "1",
    "Fraction of the engine's KV cache in use (0-1), from the engine's own /metrics.",
    (ENGINE,),
)  # fmt: skip
MBU = MetricDef(
    "llmobs.mbu", Kind.GAUGE, "1",
    "Model bandwidth utilization of decode: (weight + KV-cache bytes read per step) / TPOT / "
    "peak bandwidth, over the last minute of streamed requests.",
    (MODEL,),
)  # fmt: skip
MFU = MetricDef(
    "llmobs.mfu", Kind.GAUGE, "1",
    "Model FLOPs utilization of prefill: 2 x params x prompt tokens / prefill time / peak "
    "FLOP/s, over the last minute (prefill time: TTFT unless the engine reports it).",
    (MODEL,),
)  # fmt: skip

COLLECTOR_METRICS: tuple[MetricDef, ...] = (
    COLLECTOR_UP, COLLECTOR_DURATION, COLLECTOR_ERRORS, GPU_MEMORY_USED, GPU_MEMORY_FREE,
    GPU_MEMORY_TOTAL, GPU_MEMORY_RESERVED, GPU_UTILIZATION, GPU_MEMORY_CONTROLLER,
    GPU_BANDWIDTH_UTILIZATION, GPU_BANDWIDTH, GPU_BANDWIDTH_PEAK, GPU_POWER, GPU_TEMPERATURE,
    GPU_CLOCK_SM, GPU_CLOCK_MEMORY, ENGINE_WAITING, ENGINE_RUNNING, ENGINE_KV_CACHE, MBU, MFU,
)  # fmt: skip

CATALOGUE: tuple[MetricDef, ...] = (
    TTFT, TPOT, DURATION, TOKEN_USAGE, ITL, ITL_SQUARES, STALLS, SMOOTHNESS, REQUESTS, TOKENS,
    ENGINE_PROMPT_EVAL, ENGINE_LOAD, ACTIVE, QUEUE_DEPTH, MALFORMED, OBSERVER_ERRORS,
    SPANS_DROPPED,
    *COLLECTOR_METRICS,
)  # fmt: skip


def status_class(status: int) -> str:
    """'2xx' ... '5xx' for a status code; '0xx' when no response was produced."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "0xx"


_STATUS_CLASSES = {status: status_class(status) for status in range(600)}


class TokenHistogram:
    """Per-token ITL histogram recorded a window at a time, with its sum of squares.

    The counts of a window are added to the series like any other histogram's
    (``SeriesCollector`` exposes both families). Whole numbers of tokens as floats, as numpy's
    ``bincount`` gives them, whichever way they are binned: a large window with numpy in one
    call; a window whose ITLs are sorted (one token per chunk) a bucket at a time, by bisection,
    which is a few steps for a steady stream; a small unsorted one value by value.
    """

    def __init__(self, metric: MetricDef, squares: MetricDef) -> None:
        self.histogram = HistogramFamily(metric)
        self.squares = CounterFamily(squares)
        self._bounds = np.asarray(self.histogram.bounds, dtype=np.float64)

    def record(self, labels: tuple[str, ...], window: TokenWindow) -> None:
        """Add every ITL of ``window``, each ``weights[i]`` times (hold the collector's lock)."""
        values = window.values
        n = len(values)
        if n == 0:
            return
        series = self.histogram.series_for(labels)
        bounds = self.histogram.bounds
        ordered = window.ordered
        if ordered is not None:  # ascending, one token each
            top = len(bounds)
            if isinstance(ordered, list):
                i = 0
                while i < n:  # a run of values in one bucket at a time
                    b = bisect_left(bounds, ordered[i])
                    j = bisect_right(ordered, bounds[b], i) if b < top else n
                    series[b] += float(j - i)
                    i = j
            else:
                lo = bisect_left(bounds, float(ordered[0]))
                hi = bisect_left(bounds, float(ordered[-1]))
                done = 0
                if hi > lo:  # values at or below each bound in between
                    below = np.searchsorted(ordered, self._bounds[lo:hi], side="right").tolist()
                    for b, count in enumerate(below, lo):
                        if count != done:
                            series[b] += float(count - done)
                            done = count
                if n != done:
                    series[hi] += float(n - done)
        elif isinstance(values, list):
            counts = window.counts
            if counts is None:
                for value in values:
                    series[bisect_left(bounds, value)] += 1.0
            else:
                for value, count in zip(values, counts, strict=True):
                    series[bisect_left(bounds, value)] += count
        else:
            index = np.searchsorted(self._bounds, values, side="left")
            binned = np.bincount(index, weights=window.weights, minlength=self._bounds.size + 1)
            for i, count in enumerate(binned.tolist()):
                if count:
                    series[i] += count
        series[-1] += window.itl_sum
        self.squares.add(labels, window.itl_sumsq)


class OtelInstruments:
    """The request-level metrics as OpenTelemetry instruments, for an OTLP push.

    Only built when the telemetry pushes metrics over OTLP (``SidecarMeter.push``): then every
    request pays the SDK's ~9 us per record (~100 us per request) on top of the Prometheus
    series. Without OTLP nothing is recorded here at all.
    """

    def __init__(self, meter: Meter) -> None:
        def hist(m: MetricDef) -> Histogram:
            return meter.create_histogram(
                m.name, unit=m.unit, description=m.description,
                explicit_bucket_boundaries_advisory=list(m.buckets),
            )  # fmt: skip

        def counter(m: MetricDef) -> Counter:
            return meter.create_counter(m.name, m.unit, m.description)

        self.ttft = hist(TTFT)
        self.tpot = hist(TPOT)
        self.duration = hist(DURATION)
        self.usage = hist(TOKEN_USAGE)
        self.smooth = hist(SMOOTHNESS)
        self.prompt_eval = hist(ENGINE_PROMPT_EVAL)
        self.load = hist(ENGINE_LOAD)
        self.tokens = counter(TOKENS)
        self.stalls = counter(STALLS)
        self.requests = counter(REQUESTS)
        self.malformed = counter(MALFORMED)
        self.errors = counter(OBSERVER_ERRORS)
        self.active = meter.create_up_down_counter(ACTIVE.name, ACTIVE.unit, ACTIVE.description)
        self.queue = meter.create_up_down_counter(
            QUEUE_DEPTH.name, QUEUE_DEPTH.unit, QUEUE_DEPTH.description
        )
        for instrument in (self.active, self.queue, self.errors, self.malformed):
            instrument.add(0)

    def record_request(self, s: StreamStats, op: str, model: str, status: str) -> None:
        attrs = {OPERATION: op, MODEL: model}
        labels = {**attrs, OUTCOME: s.outcome.value, STATUS_CLASS: status}
        self.requests.add(1, {**labels, FINISH_REASON: s.finish_reason})
        self.duration.record(s.duration_s, attrs)
        if s.ttft_s is not None:
            self.ttft.record(s.ttft_s, attrs)
        if s.tpot_s is not None:
            self.tpot.record(s.tpot_s, attrs)
        if s.smoothness is not None:
            self.smooth.record(s.smoothness, attrs)
        if s.stalls:
            self.stalls.add(s.stalls, attrs)
        if s.engine_prompt_eval_s is not None:
            self.prompt_eval.record(s.engine_prompt_eval_s, attrs)
        if s.engine_load_s is not None:
            self.load.record(s.engine_load_s, attrs)
        for kind, source, value in _token_counts(s):
            if kind in ("input", "output"):
                self.usage.record(value, {**attrs, TOKEN_TYPE: kind})
            self.tokens.add(value, {**attrs, TOKEN_TYPE: kind, TOKEN_SOURCE: source})


_USAGE = TokenSource.USAGE.value


def _token_counts(s: StreamStats) -> list[tuple[str, str, int]]:
    """(token type, count source, tokens) of a request, in the order they are recorded."""
    out = []
    if s.input_tokens is not None:
        out.append(("input", _USAGE, s.input_tokens))
    if s.output_tokens or s.ttft_s is not None:
        out.append(("output", s.token_source.value, s.output_tokens))
    if s.reasoning_tokens:
        out.append(("reasoning", s.reasoning_source.value, s.reasoning_tokens))
    if s.cached_tokens:
        out.append(("cached_input", _USAGE, s.cached_tokens))
    return out


class _LabelSet:
    """The request series of one (operation, model) label set, found once: recording a request
    then updates lists it holds, with no label tuple built and no dict lookup. A histogram's
    series is made at its first observation, as before, so series still appear on /metrics in
    the order they were first recorded."""

    __slots__ = ("duration", "key", "smooth", "tpot", "ttft", "usage_in", "usage_out")

    def __init__(self, operation: str, model: str) -> None:
        self.key = (operation, model)
        self.duration: list[Number] | None = None
        self.ttft: list[Number] | None = None
        self.tpot: list[Number] | None = None
        self.smooth: list[Number] | None = None
        self.usage_in: list[Number] | None = None
        self.usage_out: list[Number] | None = None


class MetricsSink:
    """Records finished requests and token windows into the catalogue's series.

    Every series is a plain-Python accumulator (``llmobs.series``) exposed by one
    prometheus_client collector, ``collector``: a request costs a few microseconds, not the
    ~100 us of ten OpenTelemetry records. When the meter says the metrics are also pushed over
    OTLP (``SidecarMeter.push``), they are recorded there too.
    Labels come from bounded sets: the model passes through ``BoundedLabel`` so a client cannot
    explode the series count.
    """

    def __init__(
        self,
        meter: Meter,
        max_models: int,
        on_request: Callable[[str, StreamStats], None] | None = None,
    ) -> None:
        self.models = BoundedLabel(max_models)
        # (operation, model as sent) -> its label set, for models whose label cannot change
        # (known, or none): bounded by the label cap; and (operation, label) -> label set
        self._sets: dict[tuple[str, str | None], _LabelSet] = {}
        self._by_label: dict[tuple[str, str], _LabelSet] = {}
        # Called once per finished request with its bounded model label (the MBU estimate).
        self._on_request = on_request
        self._itl = TokenHistogram(ITL, ITL_SQUARES)
        self._ttft = HistogramFamily(TTFT)
        self._tpot = HistogramFamily(TPOT)
        self._duration = HistogramFamily(DURATION)
        self._usage = HistogramFamily(TOKEN_USAGE)
        self._smooth = HistogramFamily(SMOOTHNESS)
        self._prompt_eval = HistogramFamily(ENGINE_PROMPT_EVAL)
        self._load = HistogramFamily(ENGINE_LOAD)
        self._tokens = CounterFamily(TOKENS)
        self._stalls = CounterFamily(STALLS)
        self._requests = CounterFamily(REQUESTS)
        # Zero-valued series up front, so dashboards and alerts see 0 rather than no data.
        self._active = CounterFamily(ACTIVE, gauge=True)
        self._queue = CounterFamily(QUEUE_DEPTH, gauge=True)
        self._errors = CounterFamily(OBSERVER_ERRORS)
        self._malformed = CounterFamily(MALFORMED)
        for family in (self._active, self._queue, self._errors, self._malformed):
            family.series[()] = 0
        self.collector = SeriesCollector(
            (
                self._active, self._queue, self._errors, self._malformed, self._requests,
                self._duration, self._ttft, self._tpot, self._smooth, self._usage,
                self._tokens, self._stalls, self._prompt_eval, self._load,
                self._itl.histogram, self._itl.squares,
            )
        )  # fmt: skip
        self._lock = self.collector.lock
        # The sidecar's meter (``telemetry.SidecarMeter``) names the registry /metrics renders
        # and the OTLP meter, if any; with any other meter the caller registers ``collector``.
        registry = getattr(meter, "registry", None)
        if isinstance(registry, CollectorRegistry):
            registry.register(self.collector)
        push = getattr(meter, "push", None)
        self._otel = OtelInstruments(push) if isinstance(push, Meter) else None

    @property
    def tokens(self) -> SeriesCollector:
        """``collector`` under its old name (it once held only the ITL histogram); registering
        it again is harmless: a registry holds a collector once."""
        return self.collector

    def labels(self, operation: str, model: str | None, admit: bool = True) -> tuple[str, str]:
        return self._label_set(operation, model, admit).key

    def _label_set(self, operation: str, model: str | None, admit: bool) -> _LabelSet:
        """The label set of a request; a new model takes a slot only when ``admit``."""
        found = self._sets.get((operation, model))
        if found is not None:
            return found
        label = self.models.get(model, admit)
        found = self._by_label.get((operation, label))
        if found is None:
            found = self._by_label[(operation, label)] = _LabelSet(operation, label)
        if label == model or (label == UNKNOWN and not model):  # final: the model's own label
            self._sets[(operation, model)] = found
        return found

    def _gauge(self, series: dict[tuple[str, ...], Number], delta: int) -> None:
        with self._lock:
            series[()] += delta

    def request_started(self) -> None:
        self._gauge(self._active.series, 1)
        if self._otel is not None:
            self._otel.active.add(1)

    def request_ended(self) -> None:
        self._gauge(self._active.series, -1)
        if self._otel is not None:
            self._otel.active.add(-1)

    def queue_enter(self) -> None:
        self._gauge(self._queue.series, 1)
        if self._otel is not None:
            self._otel.queue.add(1)

    def queue_leave(self) -> None:
        self._gauge(self._queue.series, -1)
        if self._otel is not None:
            self._otel.queue.add(-1)

    def observer_error(self) -> None:
        self._gauge(self._errors.series, 1)
        if self._otel is not None:
            self._otel.errors.add(1)

    def malformed(self, count: int) -> None:
        if count:
            self._gauge(self._malformed.series, count)
            if self._otel is not None:
                self._otel.malformed.add(count)

    def record_tokens(
        self, operation: str, model: str | None, window: TokenWindow, admit: bool = False
    ) -> None:
        """Add a window of ITLs taken mid-stream (a long stream's; the last windows go with
        ``record_request``). A new model is admitted only when ``admit`` (a successful
        response: its request will admit it)."""
        if window.size:
            key = self._label_set(operation, model, admit).key
            with self._lock:
                self._itl.record(key, window)

    def record_request(self, s: StreamStats, windows: Sequence[TokenWindow] = ()) -> None:
        """A finished request into every request series, and its last ``windows`` of ITLs
        (those ``record_tokens`` did not take mid-stream) under the same labels: under one
        lock, list updates on series its label set keeps (``HistogramFamily.observe``,
        inlined). A window that fails to record is raised after everything else about the
        request (its series, OTLP, the per-request hook) is recorded."""
        labels = self._sets.get((s.operation, s.model))
        if labels is None:
            labels = self._label_set(s.operation, s.model, 200 <= s.status < 400)
        key = labels.key
        op, model = key
        status = _STATUS_CLASSES.get(s.status) or status_class(s.status)
        with self._lock:
            counts = self._requests.series
            # an enum's ``_value_`` is a plain attribute; ``.value`` is a Python-level property
            request = (op, model, s.outcome._value_, status, s.finish_reason)
            counts[request] = counts.get(request, 0) + 1
            series = labels.duration
            if series is None:
                series = labels.duration = self._duration.series_for(key)
            series[bisect_left(self._duration.bounds, s.duration_s)] += 1
            series[-1] += s.duration_s
            ttft = s.ttft_s
            if ttft is not None:
                series = labels.ttft
                if series is None:
                    series = labels.ttft = self._ttft.series_for(key)
                series[bisect_left(self._ttft.bounds, ttft)] += 1
                series[-1] += ttft
            tpot = s.tpot_s
            if tpot is not None:
                series = labels.tpot
                if series is None:
                    series = labels.tpot = self._tpot.series_for(key)
                series[bisect_left(self._tpot.bounds, tpot)] += 1
                series[-1] += tpot
            smooth = s.smoothness
            if smooth is not None:
                series = labels.smooth
                if series is None:
                    series = labels.smooth = self._smooth.series_for(key)
                series[bisect_left(self._smooth.bounds, smooth)] += 1
                series[-1] += smooth
            if s.stalls:
                self._stalls.add(key, s.stalls)
            if s.engine_prompt_eval_s is not None:
                self._prompt_eval.observe(key, s.engine_prompt_eval_s)
            if s.engine_load_s is not None:
                self._load.observe(key, s.engine_load_s)
            # the token counts, in _token_counts' order: input, output, reasoning, cached
            tokens = self._tokens
            counts = tokens.series
            count = s.input_tokens
            if count is not None:
                series = labels.usage_in
                if series is None:
                    series = labels.usage_in = self._usage.series_for((op, model, "input"))
                series[bisect_left(self._usage.bounds, count)] += 1
                series[-1] += count
                kind = (op, model, "input", _USAGE)
                counts[kind] = counts.get(kind, 0) + count
            count = s.output_tokens
            if count or ttft is not None:
                series = labels.usage_out
                if series is None:
                    series = labels.usage_out = self._usage.series_for((op, model, "output"))
                series[bisect_left(self._usage.bounds, count)] += 1
                series[-1] += count
                kind = (op, model, "output", s.token_source._value_)
                counts[kind] = counts.get(kind, 0) + count
            if s.reasoning_tokens:
                tokens.add((op, model, "reasoning", s.reasoning_source.value), s.reasoning_tokens)
            if s.cached_tokens:
                tokens.add((op, model, "cached_input", _USAGE), s.cached_tokens)
            failed: Exception | None = None
            for window in windows:
                if window.size:
                    try:
                        self._itl.record(key, window)
                    except Exception as exc:  # raised below, once the request is recorded
                        failed = exc
        if self._otel is not None:
            self._otel.record_request(s, op, model, status)
        if self._on_request is not None:
            self._on_request(model, s)
        if failed is not None:
            raise failed
