"""The encoders of the request series' frames (``text``, ``openmetrics``) and the /metrics
renderer that uses them (``exposition``) write the bytes prometheus_client's writers write for
the same data."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from llmobs.export.metrics import openmetrics, text
from llmobs.export.metrics.catalogue import ITL, ITL_SQUARES, REQUESTS, TTFT, Kind, MetricDef
from llmobs.export.metrics.exposition import (
    Registry,
    exposition,
    exposition_async,
    openmetrics_async,
)
from llmobs.export.metrics.frames import Frame
from llmobs.export.metrics.series import (
    CounterFamily,
    HistogramFamily,
    SeriesCollector,
    TokenHistogram,
)
from llmobs.observe.record import TraceRef
from llmobs.observe.timing import Outcome, RequestStats, TokenSource
from llmobs.observe.window import ArrayWindow, TokenWindow
from tests.support.metrics import exposition as golden_text
from tests.support.metrics import replay, sink_and_telemetry

ODD = [
    "plain",
    'quo"te',
    "back\\slash",
    "new\nline",
    'all \\" \n \\n of them',
    "unicodé ✓ 模型 🚀",
    "",
    "le",
    "x" * 300,
]
# A histogram with a label sorting after "le", a negative first bucket (no _count, _sum) and a
# description needing escapes.
ODD_HISTOGRAM = MetricDef(
    "odd.histogram", Kind.HISTOGRAM, "s", "back\\slash and\nnewline",
    ("a.label", "zone"), (-1.0, 0.5, 1e-7, 123456789.0),
)  # fmt: skip
ODD_COUNTER = MetricDef("odd.counter", Kind.COUNTER, "1", "no labels \\ here", ())


def window(gaps: list[float], weights: list[int]) -> TokenWindow:
    itl, w = np.asarray(gaps, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    return ArrayWindow(
        itl, w, 0, None, tokens=float(w.sum()), itl_sum=float((itl * w).sum()),
        itl_sumsq=float((itl * itl * w).sum()),
    )  # fmt: skip


def odd_collector() -> tuple[SeriesCollector, list[HistogramFamily | CounterFamily]]:
    ttft = HistogramFamily(TTFT)
    odd = HistogramFamily(ODD_HISTOGRAM)
    requests = CounterFamily(REQUESTS)
    gauge = CounterFamily(ODD_COUNTER, gauge=True)
    counter = CounterFamily(ODD_COUNTER)
    itl = TokenHistogram(ITL, ITL_SQUARES)
    empty = HistogramFamily(ITL)  # never recorded into: left out
    families: list[HistogramFamily | CounterFamily] = [ttft, odd, requests, empty, gauge]
    families += [counter, itl.histogram, itl.squares]
    collector = SeriesCollector(families)
    for i, value in enumerate(ODD):
        other = ODD[-1 - i]
        ttft.observe((value, other), 0.01 * i)
        ttft.observe((value, other), 0.3)
        odd.observe((value, other), -3.0)
        odd.observe((value, other), 1e9 * (i + 1))
        requests.add((value, other, "ok", "2xx", value), 10**i)
        itl.record((value, other), window([0.02, 0.004, 1.5 * i], [1, 3, 2]))
    gauge.add((), -5)
    counter.add((), 2.5e-9)
    return collector, families


def test_render_matches_generate_latest_with_odd_labels_and_values() -> None:
    collector, families = odd_collector()
    assert text.render(collector.frames()) == generate_latest(collector)
    # Cached label text is reused; new series and new values render like the rest.
    ttft, requests = families[0], families[2]
    assert isinstance(ttft, HistogramFamily)
    assert isinstance(requests, CounterFamily)
    ttft.observe(("new", 'series "x"'), 7.0)
    ttft.observe(("plain", "x" * 300), 1e30)
    requests.add(("a", "b", "c", "d", "e"), 2**70)
    written = text.render(collector.frames())
    assert written == generate_latest(collector)
    assert b'gen_ai_request_model="quo\\"te"' in written
    assert b"\\n" in written and "模型".encode() in written


def test_render_of_nothing_recorded_is_empty() -> None:
    collector = SeriesCollector([HistogramFamily(TTFT), CounterFamily(REQUESTS)])
    assert text.render(collector.frames()) == b"" == generate_latest(collector)


def test_float_counts_and_sums_match() -> None:
    itl = TokenHistogram(ITL, ITL_SQUARES)
    collector = SeriesCollector([itl.histogram, itl.squares])
    rng = np.random.default_rng(9)
    for _ in range(50):
        gaps = rng.exponential(0.03, 20).tolist()
        weights = rng.integers(1, 4, 20).tolist()
        itl.record(("chat", "m"), window(gaps, weights))
    assert text.render(collector.frames()) == generate_latest(collector)


def test_exposition_of_the_sidecar_registry_is_generate_latest() -> None:
    sink, telemetry = sink_and_telemetry(tracing=True)
    replay(sink, "llama", [20.0] * 9)
    replay(sink, 'we"ird\\mo\ndel ✓', [20.0, 300.0, 1.0])
    try:
        assert exposition(telemetry.registry) == generate_latest(telemetry.registry)
    finally:
        telemetry.shutdown()


def test_exposition_of_the_golden_data_is_the_golden_text() -> None:
    """Same recorded data as the golden test, rendered the /metrics handler's way."""
    sink, telemetry = sink_and_telemetry(tracing=True)
    from tests.support.metrics import GOLDEN  # noqa: PLC0415

    replay(sink, "llama", [20.0] * 9)
    replay(sink, "llama", [20.0] * 4 + [120.0] + [20.0] * 4)
    text = exposition(telemetry.registry).decode()
    telemetry.shutdown()
    # The golden data has more requests; every family rendered here is in it, in its order.
    golden = GOLDEN.read_text()
    families = [line for line in text.splitlines() if line.startswith("# TYPE")]
    golden_families = [line for line in golden.splitlines() if line.startswith("# TYPE")]
    assert families == [f for f in golden_families if f in families]
    assert golden_text() == golden


def test_the_registry_lists_its_collectors_as_generate_latest_walks_them() -> None:
    """``Registry`` notes collectors as they register: the order ``generate_latest`` renders
    families in, so that rendering collector by collector gives the same bytes. The sidecar's
    registry is one, and the series are rendered by their own renderer, not collected."""
    sink, telemetry = sink_and_telemetry(tracing=True)
    replay(sink, "llama", [20.0] * 9)
    registry = telemetry.registry
    assert isinstance(registry, Registry)
    members = registry.members()
    assert sink.collector in members
    walked = [name for c in members for name in _family_names(generate_latest(c))]
    assert walked == _family_names(generate_latest(registry))
    counted = CountedSeries(odd_collector()[0].families)
    registry.register(counted)
    written = exposition(registry)
    assert (counted.framed, counted.collected) == (1, 0)  # its frames encoded, not collected
    assert written == generate_latest(registry)
    registry.unregister(sink.collector)
    assert sink.collector not in registry.members()
    telemetry.shutdown()


class CountedSeries(SeriesCollector):
    """Series that count the frames taken of them and their collections."""

    framed = collected = 0

    def frames(self, exemplars: bool = False, natives: bool = False) -> list[Frame]:
        self.framed += 1
        return super().frames(exemplars, natives)

    def collect(self) -> Iterator[Metric]:
        self.collected += 1
        return super().collect()


def _family_names(text: bytes) -> list[str]:
    return [line.split()[2] for line in text.decode().splitlines() if line.startswith("# TYPE")]


def test_exposition_falls_back_for_other_registries() -> None:
    registry = CollectorRegistry(target_info={"a": "b"})
    collector, _ = odd_collector()
    registry.register(collector)
    assert exposition(registry) == generate_latest(registry)


@pytest.mark.parametrize("lines", [1, 7, 50, 1000, 10**6])
def test_render_in_parts_is_render(lines: int) -> None:
    collector, _ = odd_collector()
    assert b"".join(text.parts(collector.frames(), lines)) == text.render(collector.frames())


@pytest.mark.parametrize("lines", [1, 7, 1000])
def test_openmetrics_of_the_series_is_the_writers(lines: int) -> None:
    """The OpenMetrics encoder alone, on odd labels, values and exemplars: what
    prometheus_client's writer makes of ``collect()``, in parts of any size."""
    collector, families = odd_collector()
    ttft = families[0]
    assert isinstance(ttft, HistogramFamily)
    for i, value in enumerate(ODD[:3]):
        slots = ttft.exemplars_for((value, ODD[-1 - i]))
        slots[i] = (f"{i + 1:032x}", f"{i + 1:016x}", 0.01 * i, 1700000000.25 + i)
    written = b"".join(openmetrics.parts(collector.frames(exemplars=True), lines))
    assert written + openmetrics.EOF == openmetrics_latest(collector)  # type: ignore[no-untyped-call]
    assert written.count(b" # {span_id=") == 3


def test_exposition_async_is_generate_latest() -> None:
    sink, telemetry = sink_and_telemetry(tracing=True)
    for model in ("llama", 'we"ird\\mo\ndel ✓', "qwen"):
        replay(sink, model, [20.0] * 9)

    async def render() -> bytes:
        with ThreadPoolExecutor(1) as pool:
            return await exposition_async(telemetry.registry, pool)

    try:
        assert asyncio.run(render()) == generate_latest(telemetry.registry)
    finally:
        telemetry.shutdown()


def test_openmetrics_is_the_openmetrics_writers_with_exemplars() -> None:
    """The OpenMetrics exposition the handler serves (series rendered by their own renderer,
    exemplars and all) is byte for byte what prometheus_client's OpenMetrics writer makes of
    the same registry; and it parses, with the exemplars where they were recorded."""
    sink, telemetry = sink_and_telemetry(tracing=True)
    for model in ("llama", 'we"ird\\mo\ndel ✓'):
        replay(sink, model, [20.0] * 9)
    traced = RequestStats(
        "chat", "llama", Outcome.OK, 200, True, 1.5, 0.4, 0.03, 12, 10, TokenSource.USAGE, 10,
        9.0, 0.27, 0.0081, 0.05, 0, 0.99,
    )  # fmt: skip
    sink.record_request(
        traced, (), TraceRef("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    )

    async def render() -> bytes:
        with ThreadPoolExecutor(1) as pool:
            return await openmetrics_async(telemetry.registry, pool)

    try:
        ours = asyncio.run(render())
        assert ours == openmetrics_latest(telemetry.registry)  # type: ignore[no-untyped-call]
    finally:
        telemetry.shutdown()
    text = ours.decode()
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    assert "# TYPE llmobs_requests counter\n" in text  # OpenMetrics names counters so
    found = {
        (family.name, sample.exemplar.value)
        for family in text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
        for sample in family.samples
        if sample.exemplar is not None
    }
    assert ("gen_ai_server_time_to_first_token_seconds", 0.4) in found
    assert ("gen_ai_server_request_duration_seconds", 1.5) in found
    assert ("llmobs_inter_token_latency_seconds", 0.05) in found  # the worst gap's
