"""Where every request's record is made and where it goes: one ``Recorder`` per sidecar.

Two kinds of request end in a record: one an observer saw (``observer.Observer.finish``) and
one the server refused before it could be parsed (the app's ``on_reject``). Both go through
``record``, which makes it (labelled, judged against the request's objectives, priced) and
delivers it (to the metrics sink first, so the request is counted before anything else is done
with it, then to each consumer in order), so the two can never be labelled, judged or
delivered differently. It never raises: what fails is reported to the caller's ``on_error``
(counted and logged there), and the record goes on with what was made. One call per request,
not two: it is on every request's path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmobs.config.objectives import Objective, Objectives, ObjectiveSet
from llmobs.config.prices import Prices
from llmobs.observe.causes import Stall
from llmobs.observe.cost import request_cost
from llmobs.observe.dialects.request import NO_BODY, RequestInfo
from llmobs.observe.disagg import LEGS, PdRole
from llmobs.observe.labels import OTHER, LabelAdmission
from llmobs.observe.phases import TtftPhases
from llmobs.observe.record import RequestConsumer, RequestRecord, RequestSink, TraceRef
from llmobs.observe.slo import Verdict, judge, latency_ratio
from llmobs.observe.timing import RequestStats
from llmobs.observe.window import TokenWindow

OnError = Callable[[], None]  # called inside the ``except`` of what failed: it may log it
# a named tuple made without its ``__new__``, a Python-level call (docs/architecture.md,
# "Records are named tuples")
_new = tuple.__new__
_WHOLE = PdRole.WHOLE  # (an enum member read off its class costs a metaclass lookup)
_ERROR = (Objective.ERROR,)  # what a failed request missed: it has no latency to compare


class Recorder:
    """Makes each request's record and delivers it to the sink, then to each consumer.

    ``admission``: the bounded model and tenant labels (``labels.LabelAdmission``);
    ``objectives``: what each request is judged by; ``prices``: what its tokens cost (None:
    no cost); ``consumers``: who takes the record after the sink, in order."""

    __slots__ = ("admission", "consumers", "legs", "objectives", "prices", "sink")

    def __init__(
        self,
        sink: RequestSink,
        admission: LabelAdmission | None = None,
        objectives: Objectives | None = None,
        prices: Prices | None = None,
        consumers: Sequence[RequestConsumer] = (),
        legs: Sequence[RequestConsumer] = (),
    ) -> None:
        """``legs``: who takes the records of disaggregated requests' legs (never the sink
        nor the consumers of users' requests), and of the disaggregated requests too."""
        self.legs = tuple(legs)
        self.sink = sink
        self.admission = admission or LabelAdmission()
        self.objectives = objectives or Objectives(ObjectiveSet())
        self.prices = prices
        self.consumers = tuple(consumers)

    def record(
        self,
        stats: RequestStats,
        on_error: OnError,
        windows: Sequence[TokenWindow] = (),
        tenant: str | None = None,
        phases: TtftPhases | None = None,
        stalls: tuple[Stall, ...] = (),
        trace: TraceRef | None = None,
        request: RequestInfo = NO_BODY[False],
        labels: tuple[str, str] | None = None,
        pd: PdRole = PdRole.WHOLE,
    ) -> RequestRecord:
        """Make the request's record and deliver it: its labels (a new model or tenant
        admitted only by a successful request; ``labels``: as admitted already, at its
        answer's head), its verdict against its objectives, its cost; then to the sink and to
        each consumer, each call guarded on its own: whatever else fails, the request is
        counted once, with its outcome. Returns the record (its trace's spans take it). A
        leg of a disaggregated request is neither labelled nor judged: it goes to ``legs``
        alone."""
        if pd in LEGS:
            return self._leg(stats, on_error, phases, trace, request, pd)
        verdict: Verdict | None = None
        cost: float | None = None
        ratio: float | None = None
        label, tenant_label = OTHER, ""
        try:
            if labels is None:
                labels = self.admission.labels(stats.model, tenant, 200 <= stats.status < 400)
            label, tenant_label = labels
            objectives = self.objectives.for_request(
                stats.operation, stats.model, tenant_label or None
            )
            verdict = judge(objectives, stats, phases, stalls)
            if (
                (objectives.ttft or objectives.tpot)
                and verdict is not None
                and (
                    verdict.missed[:1] != _ERROR  # (a failed request has no latency)
                )
            ):
                ratio = latency_ratio(objectives, stats)
            if self.prices is not None:
                cost = request_cost(self.prices.of(label), stats)
        except Exception:
            on_error()
            if not tenant_label:  # labels() failed: the label of "none named" ("" if off)
                tenant_label = self._no_tenant()
        record = _new(RequestRecord, (
            stats, tuple(windows), verdict, trace, label, phases, stalls, tenant_label, cost,
            request, pd, ratio,
        ))  # fmt: skip
        try:
            self.sink.consume(record)
        except Exception:
            on_error()
        consumers = self.consumers if pd is _WHOLE else self.consumers + self.legs
        for consumer in consumers:  # (inline: once per request)
            try:
                consumer.consume(record)
            except Exception:
                on_error()
        return record

    def _leg(
        self, stats: RequestStats, on_error: OnError, phases: TtftPhases | None,
        trace: TraceRef | None, request: RequestInfo, pd: PdRole,
    ) -> RequestRecord:  # fmt: skip
        """A leg's record: no verdict, no cost, no model label (its families are by role)."""
        record = _new(RequestRecord, (
            stats, (), None, trace, OTHER, phases, (), "", None, request, pd, None,
        ))  # fmt: skip
        _deliver(record, self.legs, on_error)
        return record

    def _no_tenant(self) -> str:
        try:
            return self.admission.labels(None, None, False)[1]
        except Exception:
            return ""


def _deliver(
    record: RequestRecord, consumers: Sequence[RequestConsumer], on_error: OnError
) -> None:
    """``record`` to each of ``consumers`` in order, each call guarded on its own."""
    for consumer in consumers:
        try:
            consumer.consume(record)
        except Exception:
            on_error()
