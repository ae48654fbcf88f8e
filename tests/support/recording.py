"""A sink and its recorder as the app assembles them, for tests and benchmarks that record
requests without a server: the same classes, wired the same way (``app.Proxy``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from llmobs.config.buckets import Buckets
from llmobs.config.objectives import Objectives
from llmobs.config.prices import Prices
from llmobs.config.tenants import Tenancy
from llmobs.export.metrics.mapping import RequestMapping
from llmobs.export.metrics.series import HistogramFamily, HistogramRow
from llmobs.export.metrics.sink import MetricsSink
from llmobs.observe.causes import Stall
from llmobs.observe.labels import LabelAdmission
from llmobs.observe.phases import TtftPhases
from llmobs.observe.record import RequestConsumer, TraceRef
from llmobs.observe.recorder import Recorder
from llmobs.observe.slo import Verdict
from llmobs.observe.timing import RequestStats
from llmobs.observe.window import TokenWindow


def recording(
    registry: CollectorRegistry | None = None,
    max_models: int = 32,
    *,
    objectives: Objectives | None = None,
    tenancy: Tenancy | None = None,
    max_tenants: int = 32,
    prices: Prices | None = None,
    currency: str = "",
    buckets: Buckets = (),
    latest: bool = False,
    clock: Callable[[], float] = time.time,
    provider: str = "unknown",
    consumers: Sequence[RequestConsumer] = (),
) -> tuple[MetricsSink, Recorder]:
    """A sink on ``registry`` and the recorder that labels, judges and delivers to it (then
    to ``consumers``), from the same settings the app reads; the currency is the price
    file's unless given."""
    currency = currency or (prices.currency if prices is not None else "")
    mapping = RequestMapping(objectives, tenancy, currency, buckets, latest)
    sink = MetricsSink(registry, mapping, clock, provider)
    admission = LabelAdmission(max_models, tenancy, max_tenants)
    return sink, Recorder(sink, admission, mapping.objectives, prices, consumers)


def _raise() -> None:
    raise  # noqa: PLE0704 - called inside the ``except`` of what failed: re-raised


def record_request(
    recorder: Recorder,
    stats: RequestStats,
    windows: Sequence[TokenWindow] = (),
    trace: TraceRef | None = None,
    *,
    tenant: str | None = None,
    phases: TtftPhases | None = None,
    stalls: tuple[Stall, ...] = (),
) -> Verdict | None:
    """A request no observer saw, recorded as one would be (made, then delivered), with
    what an observer would add (its tenant, TTFT phases, stalls' causes); what fails is
    raised. Returns its verdict."""
    return recorder.record(stats, _raise, windows, tenant, phases, stalls, trace).verdict


def observe(family: HistogramFamily, key: tuple[str, ...], value: float) -> None:
    """One value into one histogram series, through a row of one member (the families' way
    in, as the sink's rows of a label set are)."""
    HistogramRow([(family, key)]).observe_all((value,))
