"""The neutral family model (``export.metrics.frames``): a family's shape as the OpenTelemetry
Prometheus exporter names it (a counter's samples end in ``_total``, once), a histogram's
bounds and ``le`` edges, and prometheus_client's model of a frame (``client_family``) with
cumulative buckets and each bucket's exemplar, which ``collect()`` and the writers of other
registries read."""

from __future__ import annotations

from prometheus_client.samples import Exemplar, Sample

from llmobs.export.metrics.catalogue import QUEUE_DEPTH, REQUESTS, TTFT, Kind, MetricDef
from llmobs.export.metrics.frames import Frame, Shape, Type, client_family

LEVEL = MetricDef("t.level", Kind.GAUGE, "1", "Level.", ("zone",), (1, 0.5))


def test_a_counter_s_samples_end_in_total_once() -> None:
    requests = Shape.of(REQUESTS, Type.COUNTER)
    assert requests.name == "llmobs_requests_total" == REQUESTS.prometheus
    assert (requests.type, requests.labels, requests.bounds) == (
        Type.COUNTER, REQUESTS.prometheus_labels, (),
    )  # fmt: skip
    assert requests.help == REQUESTS.description
    # a gauge's definition counted as a counter gains the suffix; as a gauge it keeps its name
    assert Shape.of(LEVEL, Type.COUNTER).name == "t_level_total"
    assert Shape.of(LEVEL, Type.GAUGE).name == "t_level"
    assert Shape.of(QUEUE_DEPTH, Type.GAUGE).name == QUEUE_DEPTH.prometheus


def test_a_histogram_s_bounds_edges_and_size() -> None:
    ttft = Shape.of(TTFT, Type.HISTOGRAM)
    assert ttft.bounds == TTFT.buckets and all(type(b) is float for b in ttft.bounds)
    assert ttft.size == len(TTFT.buckets) + 1  # +Inf's bucket; the sum's index
    assert ttft.edges()[:3] == ["0.01", "0.025", "0.05"] and ttft.edges()[-1] == "+Inf"
    # integer bounds are written as the float they are; a family of another type has none
    assert Shape.of(LEVEL, Type.HISTOGRAM).edges() == ["1.0", "0.5", "+Inf"]
    assert Shape.of(LEVEL, Type.GAUGE).bounds == ()


def test_a_gauge_and_a_counter_in_prometheus_client_s_model() -> None:
    gauge = client_family(Frame(Shape("t_level", "Level.", Type.GAUGE, ("zone",), ()),
                                [("a",), ("b",)], [2.5, -1]))  # fmt: skip
    assert (gauge.name, gauge.type, gauge.documentation) == ("t_level", "gauge", "Level.")
    assert gauge.samples == [
        Sample("t_level", {"zone": "a"}, 2.5), Sample("t_level", {"zone": "b"}, -1),
    ]  # fmt: skip
    counter = client_family(Frame(Shape("t_n_total", "N.", Type.COUNTER, (), ()), [()], [3]))
    assert (counter.name, counter.type) == ("t_n", "counter")
    assert counter.samples == [Sample("t_n_total", {}, 3)]


def test_a_histogram_in_prometheus_client_s_model_with_its_exemplars() -> None:
    """Per-bucket counts in the frame, cumulative in the model; a bucket's exemplar on its
    sample as trace and span labels, with its value and time."""
    shape = Shape("t_wait_seconds", "Wait.", Type.HISTOGRAM, ("op",), (0.1, 1.0))
    seen = ("ab" * 16, "cd" * 8, 0.5, 1700000000.25)
    frame = Frame(shape, [("x",), ("y",)], [1, 0, 2, 3.5, 0, 0, 1, 9.0],
                  {("x",): [None, seen, None]})  # fmt: skip
    family = client_family(frame)
    assert (family.name, family.type) == ("t_wait_seconds", "histogram")
    exemplar = Exemplar({"trace_id": "ab" * 16, "span_id": "cd" * 8}, 0.5, 1700000000.25)
    buckets = [(s.labels["op"], s.labels["le"], s.value, s.exemplar)
               for s in family.samples if s.name.endswith("_bucket")]  # fmt: skip
    assert buckets == [
        ("x", "0.1", 1, None), ("x", "1.0", 1, exemplar), ("x", "+Inf", 3, None),
        ("y", "0.1", 0, None), ("y", "1.0", 0, None), ("y", "+Inf", 1, None),
    ]  # fmt: skip
    totals = {(s.name, s.labels["op"]): s.value for s in family.samples
              if not s.name.endswith("_bucket")}  # fmt: skip
    assert totals == {
        ("t_wait_seconds_count", "x"): 3, ("t_wait_seconds_sum", "x"): 3.5,
        ("t_wait_seconds_count", "y"): 1, ("t_wait_seconds_sum", "y"): 9.0,
    }  # fmt: skip


def test_a_frame_without_series_is_a_family_without_samples() -> None:
    for type_ in Type:
        shape = Shape("t_none", "None.", type_, ("a",), (1.0,) if type_ is Type.HISTOGRAM else ())
        assert client_family(Frame(shape, [], [])).samples == []
