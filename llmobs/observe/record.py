"""What observation hands over: one record per finished request, and the shapes of those it
hands it to.

A request ends in one ``RequestRecord``: its statistics, the ITL windows not handed over
mid-stream, its verdict against its objectives (judged once, in observation), its trace's ids
(for exemplars), its model's and tenant's labels (admitted once, in observation, into the
bounded sets every consumer labels by), what its body said, its TTFT in phases, its stalls
with their causes and its cost. It is made and handed on in one place
(``recorder.Recorder.record``): to the metrics sink first and then to every consumer the app
assembles (OTLP metrics, the MBU estimate), each through one method, ``consume``, as vLLM's
stat loggers take their stats: adding a consumer is one class and one line of assembly. A
traced request's spans take the same record (``TraceHandle.finish``).

The other shapes are what observation calls while a request runs: the sink's live counts
(``LiveCounts``: in flight, queued, the windows of a long stream), the request's trace
(``TraceHandle``) and what its arrival offers (``Arrival``). Observation names them as
protocols so that it imports nothing of export (import-linter checks it), and the relay
reaches tracing only through them.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import NamedTuple, Protocol

from llmobs.observe.causes import Stall
from llmobs.observe.dialects.request import NO_BODY, RequestInfo
from llmobs.observe.disagg import PdRole
from llmobs.observe.phases import TtftPhases
from llmobs.observe.slo import Verdict
from llmobs.observe.timing import RequestStats
from llmobs.observe.window import TokenWindow

# a request's times on the relay's monotonic clock, for its spans: forwarded, first output
# token, last output token, end (None: it never got that far)
SpanTimes = tuple[int | None, int | None, int | None, int]


class TraceRef(NamedTuple):
    """The trace of a request, for its exemplars: its ids (hex, as W3C writes them) and
    whether the trace is kept when the request is good (tail sampling keeps a bad one
    always): an exemplar only ever points at a trace that is kept."""

    trace_id: str
    span_id: str
    kept_if_good: bool = True


class RequestRecord(NamedTuple):
    """One finished request, as every consumer (and its trace) receives it."""

    stats: RequestStats
    windows: tuple[TokenWindow, ...]  # the ITL windows not handed over mid-stream
    verdict: Verdict | None  # None: the request counts in no SLO series
    trace: TraceRef | None  # None: not traced
    label: str  # the model's label: the model as sent, or other/unknown (``labels``)
    phases: TtftPhases | None = None  # its TTFT in phases (None: no first token)
    # its stalls with their causes (``causes``), the first ``observer.MAX_STALLS``: those
    # past them (``stats.stalls`` counts all) are counted as unknown
    stalls: tuple[Stall, ...] = ()
    tenant: str = ""  # its tenant's label ("": tenants are not labelled), admitted as models are
    cost: float | None = None  # what its tokens cost (``observe.cost``; None: no price)
    # what its body said (the sampling settings spans show; the prompt only when captured)
    request: RequestInfo = NO_BODY[False]
    # its part in disaggregated prefill and decode (``disagg``): a leg is no user's request
    pd: PdRole = PdRole.WHOLE
    # how close its TTFT and TPOT came to their bounds (``slo.latency_ratio``; None: no
    # bound, or not judged)
    ratio: float | None = None


class RequestConsumer(Protocol):
    """Takes each finished request's record; a consumer that raises is counted as an
    observation error and the others still get the record."""

    def consume(self, record: RequestRecord) -> None: ...


class LiveCounts(Protocol):
    """What the observer tells the metrics sink while a request runs, under the labels the
    request was admitted to (``labels.LabelAdmission``)."""

    def request_started(self) -> None: ...
    def answered(self, operation: str, label: str, tenant: str) -> None: ...
    def request_ended(self) -> None: ...
    def queue_enter(self) -> None: ...
    def queue_leave(self) -> None: ...
    def observer_error(self) -> None: ...
    def malformed(self, count: int) -> None: ...
    def record_tokens(
        self, operation: str, label: str, window: TokenWindow, tenant: str
    ) -> None: ...


class RequestSink(LiveCounts, RequestConsumer, Protocol):
    """The metrics sink as the observer sees it: live counts, and the first consumer of the
    record (so that a request is counted before anything else is done with it)."""


class Arrival(Protocol):
    """What a request's arrival offers observation and its trace: the wire's request (or a
    test's stand-in). Headers are read for trace context and the tenant, never kept."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


class TraceHandle(Protocol):
    """A traced request's trace: its context goes upstream, its spans are written at the end
    from the request's record."""

    keep: bool

    def ids(self) -> tuple[str, str] | None: ...
    def inject(self, headers: MutableMapping[str, str]) -> None: ...
    def finish(self, record: RequestRecord, times: SpanTimes, completion: str | None) -> None: ...
