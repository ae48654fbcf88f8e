"""The text format's encoder (``export.metrics.text``): frames written as the bytes
``generate_latest`` writes for the same families, whatever the labels, values and number of
parts; and, on literal frames, the lines a reader of the format expects (labels sorted, ``le``
among them, counts cumulative, no _count and _sum under negative buckets)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import generate_latest

from llmobs.export.metrics import text
from llmobs.export.metrics.catalogue import ITL, ITL_SQUARES, REQUESTS, TTFT
from llmobs.export.metrics.frames import Frame, Shape, Type
from llmobs.export.metrics.series import (
    CounterFamily,
    HistogramFamily,
    SeriesCollector,
    TokenHistogram,
)
from tests.support.odd_series import odd_collector, window
from tests.support.recording import observe


def test_render_matches_generate_latest_with_odd_labels_and_values() -> None:
    collector, families = odd_collector()
    assert text.render(collector.frames()) == generate_latest(collector)
    # Cached label text is reused; new series and new values render like the rest.
    ttft, requests = families[0], families[2]
    assert isinstance(ttft, HistogramFamily)
    assert isinstance(requests, CounterFamily)
    observe(ttft, ("new", 'series "x"'), 7.0)
    observe(ttft, ("plain", "x" * 300), 1e30)
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


@pytest.mark.parametrize("lines", [1, 7, 50, 1000, 10**6])
def test_render_in_parts_is_render(lines: int) -> None:
    collector, _ = odd_collector()
    assert b"".join(text.parts(collector.frames(), lines)) == text.render(collector.frames())


def test_a_counter_s_lines_have_their_labels_sorted_and_escaped() -> None:
    shape = Shape("t_things_total", "Things\\ and\nmore.", Type.COUNTER, ("zone", "kind"), ())
    frame = Frame(shape, [("b", "a"), ('q"u\\o\nte', "c")], [3, 2.5])
    assert text.render([frame]).decode() == (
        "# HELP t_things_total Things\\\\ and\\nmore.\n"
        "# TYPE t_things_total counter\n"
        't_things_total{kind="a",zone="b"} 3.0\n'
        't_things_total{kind="c",zone="q\\"u\\\\o\\nte"} 2.5\n'
    )
    assert text.head(shape) == "# HELP t_things_total Things\\\\ and\\nmore.\n" + (
        "# TYPE t_things_total counter\n"
    )


def test_a_gauge_without_labels_is_its_name_and_value() -> None:
    shape = Shape("t_level", "Level.", Type.GAUGE, (), ())
    frame = Frame(shape, [()], [-5])
    assert text.render([frame]) == b"# HELP t_level Level.\n# TYPE t_level gauge\nt_level -5.0\n"


def test_a_histogram_s_counts_are_cumulative_with_le_among_the_labels() -> None:
    """Per-bucket counts in the frame, cumulative in the text; ``le`` sorted between the
    labels before and after it; _count is +Inf's count and _sum the frame's last number."""
    shape = Shape("t_wait_seconds", "Wait.", Type.HISTOGRAM, ("op", "a"), (0.1, 1.0))
    frame = Frame(shape, [("x", "y")], [1, 0, 2, 3.5])
    assert text.render([frame]).decode() == (
        "# HELP t_wait_seconds Wait.\n"
        "# TYPE t_wait_seconds histogram\n"
        't_wait_seconds_bucket{a="y",le="0.1",op="x"} 1.0\n'
        't_wait_seconds_bucket{a="y",le="1.0",op="x"} 1.0\n'
        't_wait_seconds_bucket{a="y",le="+Inf",op="x"} 3.0\n'
        't_wait_seconds_count{a="y",op="x"} 3.0\n'
        't_wait_seconds_sum{a="y",op="x"} 3.5\n'
    )


def test_a_histogram_with_negative_buckets_has_no_count_or_sum() -> None:
    shape = Shape("t_delta", "Delta.", Type.HISTOGRAM, (), (-1.0, 1.0))
    frame = Frame(shape, [()], [1, 1, 0, 0.5])
    assert text.render([frame]).decode().splitlines()[2:] == [
        't_delta_bucket{le="-1.0"} 1.0',
        't_delta_bucket{le="1.0"} 2.0',
        't_delta_bucket{le="+Inf"} 2.0',
    ]


def test_a_family_without_series_is_left_out() -> None:
    empty = Frame(Shape("t_none_total", "None.", Type.COUNTER, ("a",), ()), [], [])
    some = Frame(Shape("t_one_total", "One.", Type.COUNTER, (), ()), [()], [1])
    assert text.render([empty, some]) == text.render([some])
    assert b"t_none" not in text.render([empty, some])


def test_parts_are_about_the_lines_asked_for() -> None:
    """A caller on the event loop yields between parts: none runs much past ``lines``, and
    a family split across parts has its header once."""
    shape = Shape("t_n_total", "N.", Type.COUNTER, ("i",), ())
    frame = Frame(shape, [(str(i),) for i in range(10)], list(range(10)))
    parts = list(text.parts([frame], 3))
    assert [part.count(b"\n") for part in parts] == [5, 3, 3, 1]  # the header's two first
    assert b"".join(parts).count(b"# TYPE") == 1


@pytest.mark.parametrize(
    ("value", "written"),
    [(1, "1.0"), (2.5, "2.5"), (-0.0, "-0.0"), (2**70, "1.1805916207174113e+21"),
     (1e-9, "1e-09"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN")],
)  # fmt: skip
def test_a_value_is_written_as_go_writes_it(value: float, written: str) -> None:
    assert text.go(value) == written
