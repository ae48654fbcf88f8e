"""The assembly (``llmobs.app``): the event loop ``--event-loop`` asks for; the proxy's
observers (a request's tenant and trace reach its record) and its refused requests, each
recorded once and delivered as an observer's are, the sink before every consumer, a failing
consumer counted and logged and the next still served; nothing observed without
instrumentation; the tracer naming the engine it relays to; the sidecar's wiring of the
engine collector into the proxy; a start that cannot listen stopping what it started; and
``run_until`` serving until told to stop. Over loopback, against the simulated engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from importlib.metadata import requires
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.app import Proxy, Sidecar, loop_factory, run_until, tracing_for
from llmobs.config.settings import Settings
from llmobs.export.metrics.apis import ApiMetrics
from llmobs.export.metrics.query import total
from llmobs.export.telemetry import Telemetry, build_telemetry
from llmobs.export.tracing import RequestMeta
from llmobs.observe.dialects import OPENAI_CHAT
from llmobs.observe.dialects.base import JSON_PARSER
from llmobs.observe.record import RequestConsumer, RequestRecord
from llmobs.observe.timing import Outcome
from llmobs.wire.listen import ListenError
from tests.support.ports import port_of, refused_port
from tests.support.rawhttp import status_of
from tests.support.servers import SimFactory, eventually
from tests.support.sim_streams import FAST, MESSAGES

GARBAGE = b"GARBAGE\r\n\r\n"  # a head the server refuses before it can be parsed: a 400
Seen = list[tuple[str, RequestRecord, float]]


class Probe:
    """A consumer noting each record it takes, and how many requests the sink had counted
    by then."""

    def __init__(self, name: str, telemetry: Telemetry, seen: Seen) -> None:
        self.name = name
        self._registry = telemetry.registry
        self._seen = seen

    def consume(self, record: RequestRecord) -> None:
        self._seen.append((self.name, record, total(self._registry, "llmobs_requests_total")))


class Broken:
    """A consumer with a bug."""

    def consume(self, record: RequestRecord) -> None:
        raise RuntimeError("a consumer's bug")


def _settings(upstream: str, **overrides: Any) -> Settings:
    """On loopback ports of its own; no engine collector unless asked."""
    fields: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "metrics_host": "127.0.0.1",
                              "metrics_port": 0, "engine_scrape_interval": 0}  # fmt: skip
    return Settings(upstream=upstream, **{**fields, **overrides})


@contextlib.asynccontextmanager
async def _proxy(
    settings: Settings, telemetry: Telemetry, consumers: Sequence[RequestConsumer] = ()
) -> AsyncIterator[str]:
    """The proxy port alone, as the sidecar assembles it; its URL."""
    proxy = Proxy(settings, telemetry, consumers)
    port = await proxy.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await proxy.stop(1.0)
        telemetry.shutdown()


async def _chat(url: str, headers: dict[str, str] | None = None) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        await resp.read()


# --- the proxy's observers, records and consumers -------------------------------------------


async def test_a_refused_request_is_recorded_once_the_sink_first(start_sim: SimFactory) -> None:
    sim = await start_sim(**FAST)
    telemetry = build_telemetry(self_metrics=False)
    seen: Seen = []
    probes = [Probe(name, telemetry, seen) for name in ("first", "second")]
    async with _proxy(_settings(sim.url), telemetry, probes) as url:
        assert await status_of(url, GARBAGE) == 400
        await eventually(lambda: len(seen) == 2)
    assert [(name, r.stats.outcome, r.stats.status, counted) for name, r, counted in seen] == [
        ("first", Outcome.REJECTED, 400, 1.0), ("second", Outcome.REJECTED, 400, 1.0)]  # fmt: skip
    assert seen[0][1] is seen[1][1]  # one record, made once
    assert total(telemetry.registry, "llmobs_requests_total", outcome="rejected") == 1
    assert sim.engine.counters.requests_received == 0  # nothing relayed


async def test_a_failing_consumer_is_counted_and_the_next_still_served(
    start_sim: SimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    sim = await start_sim(**FAST)
    telemetry = build_telemetry(self_metrics=False)
    seen: Seen = []
    async with _proxy(
        _settings(sim.url), telemetry, [Broken(), Probe("after", telemetry, seen)]
    ) as url:
        with caplog.at_level(logging.ERROR, "llmobs"):
            assert await status_of(url, GARBAGE) == 400
            await eventually(lambda: len(seen) == 1)
    assert total(telemetry.registry, "llmobs_observer_errors_total") == 1
    assert total(telemetry.registry, "llmobs_requests_total") == 1
    (logged,) = [
        r for r in caplog.records if r.getMessage() == "recording a refused request failed"
    ]
    assert logged.exc_info is not None and isinstance(logged.exc_info[1], RuntimeError)


async def test_an_answered_request_reaches_the_consumers_with_its_tenant_and_trace(
    start_sim: SimFactory,
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=3, output_tokens_max=3)
    telemetry = build_telemetry(span_exporter=InMemorySpanExporter(), self_metrics=False)
    seen: Seen = []
    settings = _settings(sim.url, tenant_header="X-Tenant-Id")
    async with _proxy(settings, telemetry, [Probe("probe", telemetry, seen)]) as url:
        await _chat(url, {"X-Tenant-Id": "acme"})
        await eventually(lambda: len(seen) == 1)
    ((_, record, counted),) = seen
    assert (record.stats.outcome, record.stats.status, counted) == (Outcome.OK, 200, 1.0)
    assert (record.tenant, record.label) == ("acme", "m")
    assert record.trace is not None  # the observer was given the request's trace
    assert "traceparent" in sim.engine.counters.last_headers  # made before it was sent


async def test_without_instrumentation_nothing_is_observed(start_sim: SimFactory) -> None:
    sim = await start_sim(**FAST, output_tokens_min=3, output_tokens_max=3)
    telemetry = build_telemetry(span_exporter=InMemorySpanExporter(), self_metrics=False)
    seen: Seen = []
    settings = _settings(sim.url, instrument=False)
    async with _proxy(settings, telemetry, [Probe("probe", telemetry, seen)]) as url:
        await _chat(url)
        assert await status_of(url, GARBAGE) == 400
    assert sim.engine.counters.completed == 1  # relayed all the same
    assert "traceparent" not in sim.engine.counters.last_headers
    assert seen == []
    assert total(telemetry.registry, "llmobs_requests_total") == 0


@pytest.mark.parametrize(
    ("upstream", "address", "port"),
    [("http://engine:8000", "engine", 8000), ("http://engine", "engine", 80),
     ("https://engine/v1", "engine", 443), ("http://[::1]:9", "::1", 9)],
)  # fmt: skip
def test_a_span_names_the_engine_relayed_to(upstream: str, address: str, port: int) -> None:
    telemetry = build_telemetry(span_exporter=InMemorySpanExporter(), self_metrics=False)
    tracing = tracing_for(_settings(upstream), telemetry)
    assert tracing is not None
    span = tracing.start(OPENAI_CHAT, 0, RequestMeta("POST", "/v1/chat/completions", {}, 0)).span
    assert isinstance(span, ReadableSpan) and span.attributes is not None
    assert (span.attributes["server.address"], span.attributes["server.port"]) == (address, port)
    span.end()
    telemetry.shutdown()
    untraced = build_telemetry(self_metrics=False)
    assert tracing_for(_settings(upstream), untraced) is None
    untraced.shutdown()


# --- the event loop and the process -----------------------------------------------------------


def test_the_default_install_is_the_fast_one() -> None:
    """``pip install .`` brings uvloop and orjson (where they have wheels), and ``serve``
    runs on uvloop by default (docs/benchmarks.md: 1.51-1.58 x nginx's CPU per chunk on
    asyncio, 1.34-1.40 x on uvloop)."""
    default = {re.split(r"[<>=!~;\[ ]", r)[0]: r for r in requires("llmobs") or []
               if "extra ==" not in r}  # fmt: skip
    assert {"uvloop", "orjson"} <= set(default)
    assert "win32" in default["uvloop"]  # a marker where it has no wheels
    assert JSON_PARSER == "orjson"
    for choice in ("auto", "uvloop"):
        factory = loop_factory(choice)
        assert factory is not None
        loop = factory()
        try:
            assert type(loop).__module__.startswith("uvloop")
        finally:
            loop.close()
    assert loop_factory("asyncio") is None  # asyncio's own


def test_serving_tunes_the_process() -> None:
    """In a process of its own: the switch interval and the frozen heap are the whole
    process's."""
    script = ("import gc, sys; from llmobs.app import SWITCH_INTERVAL, tune_process; "
              "tune_process(); print(sys.getswitchinterval() == SWITCH_INTERVAL, "
              "gc.get_freeze_count() > 0)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout == "True True\n"


# --- the sidecar ------------------------------------------------------------------------------


def test_the_sidecar_wires_the_engine_collector_into_the_proxy() -> None:
    """The engine's preemptions are a stall cause and its name the provider's: both reach
    the proxy; the collectors take each record (MBU/MFU) after the sink."""
    telemetry = build_telemetry(self_metrics=False)
    sidecar = Sidecar(_settings("http://engine:8000", engine_scrape_interval=5.0), telemetry)
    engine = sidecar.collectors.engine
    assert engine is not None
    assert engine.on_preemptions == sidecar.proxy.timeline.preemptions
    assert engine.on_engine == sidecar.proxy.provider.engine
    collectors, api = sidecar.proxy.recorder.consumers  # (theirs, then each request's API)
    assert isinstance(api, ApiMetrics) and collectors is sidecar.collectors
    assert sidecar.live is not None  # the live page, on by default
    bare = Sidecar(_settings("http://engine:8000", ui=False), telemetry)
    assert (bare.collectors.engine, bare.live) == (None, None)
    telemetry.shutdown()


async def test_a_port_taken_stops_what_started(start_sim: SimFactory) -> None:
    sim = await start_sim(**FAST)
    with refused_port() as taken:
        settings = _settings(sim.url, port=port_of(taken))
        sidecar = Sidecar(settings, build_telemetry(self_metrics=False))
        with pytest.raises(ListenError):
            await sidecar.start()
    # the admin port had started (first: its engine scrape names the provider)
    assert sidecar.metrics_port != 0 and sidecar.lifecycle.draining
    with pytest.raises(ConnectionRefusedError):  # and was stopped
        await asyncio.open_connection("127.0.0.1", sidecar.metrics_port)
    await sidecar.stop()  # stopped already: nothing more to do


async def test_run_until_serves_until_told_to_stop(start_sim: SimFactory) -> None:
    sim = await start_sim(**FAST)
    stop = asyncio.Event()
    started: list[Sidecar] = []
    serving = asyncio.create_task(
        run_until(_settings(sim.url), build_telemetry(self_metrics=False), stop, started.append)
    )
    await eventually(lambda: len(started) == 1)
    (sidecar,) = started
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{sidecar.metrics_port}/healthz") as resp,
    ):
        assert resp.status == 200
    await _chat(f"http://127.0.0.1:{sidecar.port}")
    stop.set()
    await asyncio.wait_for(serving, 30)
    assert sidecar.lifecycle.draining
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", sidecar.port)
