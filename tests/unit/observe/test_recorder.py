"""Where every record is made and where it goes (``observe.recorder``): labelled, judged and
priced in one place whichever way a request ended; delivered to the sink first, then to each
consumer in order; nothing raised, every failure told to the caller."""

from __future__ import annotations

import pytest

from llmobs.config.objectives import Objective, Objectives, ObjectiveSet
from llmobs.config.prices import Price, Prices
from llmobs.config.tenants import Tenancy
from llmobs.observe.labels import OTHER, UNKNOWN, LabelAdmission
from llmobs.observe.record import RequestRecord
from llmobs.observe.recorder import Recorder
from llmobs.observe.slo import GOOD, Verdict
from llmobs.observe.timing import Outcome, RequestStats, TokenSource, unparsed
from llmobs.observe.window import TokenWindow


class Kept:
    """A consumer (or a sink: the recorder asks no more of it) that keeps what it is given."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name, self.order = name, order
        self.records: list[RequestRecord] = []

    def consume(self, record: RequestRecord) -> None:
        self.order.append(self.name)
        self.records.append(record)


class Broken:
    def consume(self, record: RequestRecord) -> None:
        raise RuntimeError("boom")


def _stats(model: str | None = "m", status: int = 200, ttft: float = 0.1) -> RequestStats:
    return RequestStats(
        "chat", model, Outcome.OK, status, True, 1.0, ttft, 0.01, 1000, 2000,
        TokenSource.USAGE, 10, 9.0, 0.09, 0.001, 0.02, 0, 1.0,
    )  # fmt: skip


def _recorder(sink: object, consumers: tuple[object, ...] = (), **kw: object) -> Recorder:
    return Recorder(sink, consumers=consumers, **kw)  # type: ignore[arg-type]


def _never() -> None:
    raise AssertionError("nothing failed")


def test_a_record_is_labelled_judged_and_priced_once() -> None:
    objectives = Objectives(
        ObjectiveSet(ttft=0.5), {(None, "m", "team-a"): ObjectiveSet(ttft=0.05)}
    )
    prices = Prices("EUR", {"m": Price(1.0, 2.0, 1.0, 2.0)})
    admission = LabelAdmission(1, Tenancy(header="x-tenant"), 1)
    recorder = Recorder(Kept("sink", []), admission, objectives, prices)  # type: ignore[arg-type]
    window = TokenWindow([0.01], None, 0, None)
    record = recorder.record(_stats(), _never, [window], "team-a")
    assert (record.label, record.tenant) == ("m", "team-a")
    # the tenant's own objective (50 ms), not the default (500 ms)
    assert record.verdict == Verdict(False, (Objective.TTFT,), ("none",))
    assert record.cost == pytest.approx((1000 * 1.0 + 2000 * 2.0) / 1e6)
    assert record.windows == (window,)
    other = recorder.record(_stats("n"), _never, tenant="team-b")
    assert (other.label, other.tenant, other.verdict) == (OTHER, OTHER, GOOD)
    assert other.cost is None  # no price for "other"


def test_a_failed_request_admits_no_model() -> None:
    recorder = _recorder(Kept("sink", []))
    assert recorder.record(_stats(status=404), _never).label == OTHER
    assert recorder.record(_stats(status=200), _never).label == "m"
    assert recorder.record(_stats(status=404), _never).label == "m"  # admitted since


def test_a_refused_request_is_made_as_any_other() -> None:
    recorder = _recorder(Kept("sink", []), admission=LabelAdmission(4, Tenancy(header="t")))
    record = recorder.record(unparsed(400, 0.01), _never)
    assert (record.label, record.tenant) == (UNKNOWN, UNKNOWN)
    assert record.stats.outcome is Outcome.REJECTED
    assert record.cost is None


def test_the_sink_first_then_each_consumer_in_order_a_broken_one_told() -> None:
    order: list[str] = []
    sink, first, last = Kept("sink", order), Kept("first", order), Kept("last", order)
    recorder = _recorder(sink, (first, Broken(), last))
    failures: list[str] = []
    record = recorder.record(_stats(), lambda: failures.append("consumer"))
    assert order == ["sink", "first", "last"]
    assert failures == ["consumer"]
    assert sink.records == first.records == last.records == [record]


def test_a_broken_sink_is_told_and_the_consumers_still_get_the_record() -> None:
    order: list[str] = []
    consumer = Kept("consumer", order)
    recorder = _recorder(Broken(), (consumer,))
    failures: list[int] = []
    recorder.record(_stats(), lambda: failures.append(1))
    assert (failures, order) == ([1], ["consumer"])


class BrokenAdmission(LabelAdmission):
    def labels(self, model: str | None, tenant: str | None, admit: bool) -> tuple[str, str]:
        if model is not None:
            raise RuntimeError("boom")
        return super().labels(model, tenant, admit)


def test_what_fails_in_the_making_is_told_and_the_record_goes_on() -> None:
    admission = BrokenAdmission(4, Tenancy(header="x-tenant"))
    recorder = _recorder(Kept("sink", []), admission=admission)
    failures: list[int] = []
    record = recorder.record(_stats(), lambda: failures.append(1), tenant="a")
    assert failures == [1]
    # counted all the same: under other, the tenant label of "none named", not judged
    assert (record.label, record.tenant, record.verdict) == (OTHER, UNKNOWN, None)
