"""The OpenMetrics encoder (``export.metrics.openmetrics``): frames written as the bytes
prometheus_client's OpenMetrics writer gives for the same families, exemplars included, in
parts of any size; what it writes apart from the text format (a family's header, a bucket's
exemplar) on literal frames; and no ``# EOF`` of its own (the renderer closes the page)."""

from __future__ import annotations

import pytest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from llmobs.export.metrics import openmetrics, text
from llmobs.export.metrics.frames import Frame, Shape, Type
from llmobs.export.metrics.series import HistogramFamily
from tests.support.odd_series import ODD, odd_collector

TRACE, SPAN = "ab" * 16, "cd" * 8


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


@pytest.mark.parametrize(
    ("shape", "header"),
    [
        # a counter's family is named without _total, its samples with it
        (Shape("t_things_total", "Things.", Type.COUNTER, ("a",), ()),
         "# HELP t_things Things.\n# TYPE t_things counter\n"),
        (Shape("t_level", "Level.", Type.GAUGE, (), ()),
         "# HELP t_level Level.\n# TYPE t_level gauge\n"),
        (Shape("t_wait_seconds", "Wait.", Type.HISTOGRAM, (), (0.1,)),
         "# HELP t_wait_seconds Wait.\n# TYPE t_wait_seconds histogram\n"),
    ],
)  # fmt: skip
def test_a_family_s_header_is_the_writer_s(shape: Shape, header: str) -> None:
    assert openmetrics.head(shape) == header
    assert openmetrics.head(shape) is openmetrics.head(shape)  # taken once per shape


def test_a_bucket_s_exemplar_follows_its_value() -> None:
    assert openmetrics.exemplar((TRACE, SPAN, 0.5, 1700000000.25)) == (
        f' # {{span_id="{SPAN}",trace_id="{TRACE}"}} 0.5 1700000000.25'
    )
    assert openmetrics.exemplar((TRACE, SPAN, 2.0, 1.0)).endswith("} 2.0 1.0")


def test_the_lines_are_the_text_format_s_but_for_header_and_exemplars() -> None:
    shape = Shape("t_wait_seconds", "Wait.", Type.HISTOGRAM, ("a",), (0.1, 1.0))
    slots = [None, (TRACE, SPAN, 0.5, 1700000000.25), None]
    frame = Frame(shape, [("x",)], [1, 0, 2, 3.5], {("x",): slots})
    written = b"".join(openmetrics.parts([frame])).decode().splitlines()
    assert written == [
        "# HELP t_wait_seconds Wait.",
        "# TYPE t_wait_seconds histogram",
        't_wait_seconds_bucket{a="x",le="0.1"} 1.0',
        f't_wait_seconds_bucket{{a="x",le="1.0"}} 1.0 # {{span_id="{SPAN}",trace_id="{TRACE}"}}'
        " 0.5 1700000000.25",
        't_wait_seconds_bucket{a="x",le="+Inf"} 3.0',
        't_wait_seconds_count{a="x"} 3.0',
        't_wait_seconds_sum{a="x"} 3.5',
    ]
    # the sample lines are the text format's, up to the exemplar
    assert [line.split(" # ")[0] for line in written[2:]] == (
        text.render([frame]).decode().splitlines()[2:]
    )
    assert b"# EOF" not in b"".join(openmetrics.parts([frame]))
