"""What observation hands over: one record per finished request, and the shapes of those it
hands it to.

A request ends in one ``RequestRecord``: its statistics, the ITL windows not handed over
mid-stream, its verdict against its objectives (judged once, here in observation), its
trace's ids (for exemplars) and its model's label (admitted once, here in observation, into
the bounded set every consumer labels by). Every consumer (the Prometheus series, and
whatever the app assembles beside them: OTLP metrics, the MBU estimate) takes that record
through one method, ``consume``, as vLLM's stat loggers take their stats: adding a consumer
is one class and one line of assembly.

The other two shapes are what the observer calls while a request runs: the sink's live counts
(``LiveCounts``: in flight, queued, the windows of a long stream) and the request's trace
(``TraceHandle``, when it is traced). Observation names them as protocols so that it imports
nothing of export (import-linter checks it).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import NamedTuple, Protocol

from llmobs.observe.causes import Stall
from llmobs.observe.phases import TtftPhases
from llmobs.observe.slo import Verdict
from llmobs.observe.timing import RequestStats
from llmobs.observe.window import TokenWindow


class TraceRef(NamedTuple):
    """The trace of a request, for its exemplars: its ids (hex, as W3C writes them) and
    whether the trace is kept when the request is good (tail sampling keeps a bad one
    always): an exemplar only ever points at a trace that is kept."""

    trace_id: str
    span_id: str
    kept_if_good: bool = True


class RequestRecord(NamedTuple):
    """One finished request, as every consumer receives it."""

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


class RequestDetails(NamedTuple):
    """Request parameters spans may show: the body's sampling settings, optional content."""

    max_tokens: int | None = None
    temperature: float | None = None
    prompt: str | None = None  # only with --capture-content, truncated
    completion: str | None = None  # only with --capture-content, truncated
    verdict: Verdict | None = None  # against the request's objectives (None: not judged)
    phases: TtftPhases | None = None  # the TTFT in phases (``phases``)
    stalls: tuple[Stall, ...] = ()  # each stall with its cause (``causes``)
    tenant: str = ""  # the tenant's label ("": tenants not labelled)
    cost: float | None = None  # what its tokens cost, in the price file's currency


class RequestConsumer(Protocol):
    """Takes each finished request's record; a consumer that raises is counted as an
    observation error and the others still get the record."""

    def consume(self, record: RequestRecord) -> None: ...


class LiveCounts(Protocol):
    """What the observer tells the metrics sink while a request runs; ``labels`` maps a
    request's model and tenant onto the bounded sets the sink's series are labelled by."""

    def request_started(self) -> None: ...
    def labels(self, model: str | None, tenant: str | None, admit: bool) -> tuple[str, str]: ...
    def answered(self, operation: str, model: str | None, tenant: str | None) -> None: ...
    def request_ended(self) -> None: ...
    def queue_enter(self) -> None: ...
    def queue_leave(self) -> None: ...
    def observer_error(self) -> None: ...
    def malformed(self, count: int) -> None: ...
    def record_tokens(
        self, operation: str, label: str, window: TokenWindow, tenant: str = ""
    ) -> None: ...


class RequestSink(LiveCounts, RequestConsumer, Protocol):
    """The metrics sink as the observer sees it: live counts, and the first consumer of the
    record (so that a request is counted before anything else is done with it)."""


class TraceHandle(Protocol):
    """A traced request's trace: its context goes upstream, its spans are written at the end."""

    keep: bool

    def ids(self) -> tuple[str, str] | None: ...
    def inject(self, headers: MutableMapping[str, str]) -> None: ...
    def finish(
        self,
        record: RequestStats,
        windows: Sequence[TokenWindow],
        times: tuple[int | None, int | None, int | None, int],
        details: RequestDetails,
    ) -> None: ...
