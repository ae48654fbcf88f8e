"""Pure statistics: ITL per token, stalls, smoothness, TPOT, on literal timestamps; the
plain-Python small-window path against the numpy one (hypothesis)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from llmobs.observe import stats
from llmobs.observe.timing import Outcome, RequestStats, StreamTimer, TokenSource
from llmobs.observe.window import TokenWindow
from tests.support.strategies import FAST, chunk_tokens, gap_ns, token_streams
from tests.support.window import fill_classic

MS = 1_000_000  # ns


def schedule(gaps_ms: list[float], start_ms: float = 100.0) -> list[int]:
    """Chunk arrival times (ns) for a first chunk at ``start_ms`` followed by ``gaps_ms``."""
    times = [start_ms]
    for gap in gaps_ms:
        times.append(times[-1] + gap)
    return [round(t * MS) for t in times]


def run(times: list[int], tokens: list[int] | None = None, total: int | None = None,
        window: int = 4096) -> tuple[StreamTimer, list[TokenWindow]]:  # fmt: skip
    timer = StreamTimer(0, factor=3.0, min_gap=0.05, window=window)
    windows = []
    for i, t in enumerate(times):
        timer.output(t, tokens[i] if tokens else 1)
        if len(timer.times) > timer.window:
            windows.append(timer.take_window())
    windows.append(timer.take_window(total_tokens=total))
    return timer, windows


def finish(timer: StreamTimer, end_ns: int, output: int | None = None) -> RequestStats:
    return timer.finish(
        end_ns, operation="chat", model="m", outcome=Outcome.OK, status=200, stream=True,
        input_tokens=10, output_tokens=output,
    )  # fmt: skip


def test_ttft_tpot_and_itl_on_a_steady_stream() -> None:
    times = schedule([20.0] * 9)  # 10 chunks, 20 ms apart, first at 100 ms
    timer, windows = run(times)
    record = finish(timer, times[-1] + 5 * MS)
    assert record.ttft_s == pytest.approx(0.100)
    assert record.tpot_s == pytest.approx(0.020)
    assert record.output_tokens == 10
    assert record.token_source is TokenSource.COUNTED
    assert record.itl_count == 9
    assert record.itl_sum == pytest.approx(0.180)
    assert record.smoothness == pytest.approx(1.0)
    assert record.stalls == 0
    assert np.allclose(windows[-1].itl, 0.020)


def test_multi_token_chunks_divide_the_gap_per_token() -> None:
    times = schedule([60.0, 60.0])  # chunks of 3 tokens every 60 ms
    timer, windows = run(times, tokens=[3, 3, 3])
    record = finish(timer, times[-1])
    assert np.allclose(windows[-1].itl, [0.020, 0.020])
    assert list(windows[-1].weights) == [3.0, 3.0]
    assert record.itl_count == 6
    assert record.output_tokens == 9
    assert record.tpot_s == pytest.approx(0.120 / 8)


def test_final_usage_is_spread_over_chunks() -> None:
    times = schedule([60.0] * 4)  # 5 chunks, engine says 13 tokens: 1 first, then 3 per chunk
    timer, windows = run(times, total=13)
    record = finish(timer, times[-1], output=13)
    assert record.token_source is TokenSource.USAGE
    assert list(windows[-1].weights) == [3.0] * 4
    assert np.allclose(windows[-1].itl, 0.020)
    assert record.itl_count == 12


def test_periodic_pause_is_a_stall_and_jitter_is_not() -> None:
    rng = np.random.default_rng(1)
    jitter = list(20.0 * (1 + rng.uniform(-0.2, 0.2, 199)))
    paused = [120.0 if (i + 1) % 50 == 0 else 20.0 for i in range(199)]
    t_j, _ = run(schedule(jitter))
    t_p, _ = run(schedule(paused))
    jittered, stuttering = finish(t_j, 10**10), finish(t_p, 10**10)
    assert jittered.stalls == 0
    assert stuttering.stalls == 3
    assert stuttering.smoothness is not None and jittered.smoothness is not None
    assert stuttering.smoothness < 0.8
    assert jittered.smoothness > 0.95


def test_pause_every_50_tokens_scores_well_below_ten_percent_jitter() -> None:
    rng = np.random.default_rng(3)
    jitter = list(20.0 * (1 + rng.uniform(-0.1, 0.1, 499)))
    paused = [120.0 if (i + 1) % 50 == 0 else 20.0 for i in range(499)]
    steady = finish(run(schedule(jitter))[0], 10**10).smoothness
    stutter = finish(run(schedule(paused))[0], 10**10).smoothness
    assert steady is not None and stutter is not None
    assert steady > 0.99
    assert stutter == pytest.approx(0.71, abs=0.03)


def test_smoothness_is_independent_of_speed() -> None:
    rng = np.random.default_rng(2)
    shape = 1 + rng.uniform(-0.1, 0.1, 100)
    fast, _ = run(schedule(list(10.0 * shape)))
    slow, _ = run(schedule(list(100.0 * shape)))
    assert finish(fast, 10**10).smoothness == pytest.approx(finish(slow, 10**10).smoothness)


def test_windows_keep_memory_bounded_and_totals_exact() -> None:
    gaps = [20.0] * 999
    timer, windows = run(schedule(gaps), window=100)
    record = finish(timer, 10**11)
    assert len(windows) >= 10
    assert sum(w.tokens for w in windows) == 999
    assert record.itl_sum == pytest.approx(0.020 * 999)
    assert len(timer.times) <= 101


def test_short_requests_have_no_rhythm_to_break() -> None:
    timer, _ = run(schedule([500.0]))  # one long gap, two chunks
    assert finish(timer, 10**10).stalls == 0


def test_smoothness_formula_matches_cv() -> None:
    x = np.array([0.02, 0.02, 0.12, 0.02])
    expected = 1 / (1 + (x.std() / x.mean()) ** 2)
    assert stats.smoothness(x.size, x.sum(), (x * x).sum()) == pytest.approx(expected)
    assert stats.smoothness(1, 0.02, 0.0004) is None


def test_no_output_means_no_ttft() -> None:
    record = finish(StreamTimer(0), 5 * MS)
    assert record.ttft_s is None and record.tpot_s is None and record.output_tokens == 0
    assert record.duration_s == pytest.approx(0.005)


def test_long_stream_with_only_final_usage_is_spread_evenly() -> None:
    times = schedule([40.0] * 1999)  # 2000 chunks of 2 tokens, 20 ms per token
    timer, windows = run(times, total=4000, window=65536)
    record = finish(timer, times[-1], output=4000)
    assert len(windows) == 1
    assert record.itl_count == 3999
    assert record.smoothness == pytest.approx(1.0, abs=1e-3)


# The plain-Python path for small windows against numpy's: the same numbers to the last bit.


@st.composite
def windows(draw: st.DrawFn) -> tuple[list[int], list[float] | None]:
    """Chunk times (an anchor first; mostly rising, sometimes not) and maybe token counts."""
    n = draw(st.integers(0, stats.SMALL - 1))
    times = [draw(st.integers(0, 10**15))]
    for _ in range(n):
        step = draw(gap_ns)
        times.append(times[-1] + (step if draw(st.integers(0, 20)) else -step))
    counts = draw(st.none() | st.lists(chunk_tokens, min_size=n, max_size=n))
    return times, None if counts is None else [float(c) for c in counts]


def same_window(a: TokenWindow, b: TokenWindow) -> None:
    """Every number of two windows equal, bit for bit (and the sign of zero)."""
    for name in ("stalls", "median_gap", "tokens", "itl_sum", "itl_sumsq", "itl_max"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x, repr(x)) == (y, repr(y)), name
    assert a.stall_threshold == b.stall_threshold
    for name in ("itl", "weights", "gaps", "times_ns"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tolist() == y.tolist(), name
    assert a.size == b.size
    if a.ordered is not None or b.ordered is not None:
        assert a.ordered is not None and b.ordered is not None
        assert list(a.ordered) == list(b.ordered)


@FAST
@given(
    windows(),
    st.sampled_from([3.0, 1.5, 10.0]),
    st.sampled_from([0.05, 0.0, 1.0]),
    st.none() | st.floats(0.0, 1.0),
)
def test_small_window_is_numpy_window(
    window: tuple[list[int], list[float] | None],
    factor: float,
    min_gap: float,
    baseline: float | None,
) -> None:
    times, tokens = window
    knobs = {"factor": factor, "min_gap": min_gap, "baseline_median": baseline}
    small = stats.small_window(times, tokens, **knobs)  # type: ignore[arg-type]
    array = None if tokens is None else np.array(tokens, dtype=np.float64)
    full = stats.token_window(np.array(times, dtype=np.int64), array, **knobs)  # type: ignore[arg-type]
    same_window(small, full)


@FAST
@given(st.lists(st.floats(-1e3, 1e3) | st.sampled_from([0.0, -0.0, 1e-9, 0.02]), max_size=127))
@example([1e-08, 3.0, 1e8, 3.0, 0.001, 0.001, 0.001, 0.7])  # the tree of lanes matters here
def test_pairwise_sums_are_numpy_sums(values: list[float]) -> None:
    array = np.array(values, dtype=np.float64)
    want = float(np.add.reduce(array))
    for by, products in ((None, array * array), (values[::-1], array * array[::-1])):
        got = stats.pairwise_sums(values, by)
        expected = (want, float(np.add.reduce(products)))
        assert (got, repr(got)) == (expected, repr(expected))


@FAST
@given(token_streams())
def test_timer_windows_and_record_are_the_same_by_either_path(
    stream: tuple[list[tuple[int, int]], int | None, int],
) -> None:
    chunks, total, size = stream
    records, taken = [], []
    for small in (stats.SMALL, 0):  # plain Python where windows are small, then numpy always
        timer = StreamTimer(0, window=size, small=small)
        got = []
        for t, tokens in chunks:
            if timer.output(t, tokens):
                got.append(timer.take_window())
        got.append(timer.take_window(total_tokens=total))
        taken.append(got)
        records.append(finish(timer, 10**13, output=total))
        assert (timer.first_ns, timer.last_ns, timer.chunks) == (
            chunks[0][0] if chunks else None, chunks[-1][0] if chunks else None, len(chunks),
        )  # fmt: skip
    assert len(taken[0]) == len(taken[1])
    for a, b in zip(*taken, strict=True):
        same_window(a, b)
    assert records[0] == records[1]
    assert [repr(v) for v in records[0]] == [repr(v) for v in records[1]]


def test_the_record_has_every_field_where_it_belongs() -> None:
    """``finish_request`` builds the record by position: each value lands in its field."""
    timer, _ = run(schedule([20.0, 20.0]))
    meta = {
        "operation": "op", "model": "mo", "outcome": Outcome.SHUTDOWN, "status": 299,
        "stream": False, "input_tokens": 11, "output_tokens": 13, "response_model": "rm",
        "response_id": "ri", "finish_reasons": ("a", "b"), "finish_reason": "fr",
        "reasoning_tokens": 17, "reasoning_source": TokenSource.COUNTED, "cached_tokens": 19,
        "engine_prompt_eval_s": 0.25, "engine_load_s": 0.5, "dialect": "di", "engine_queue_s": 0.75,
        "grpc_status": 14,
    }  # fmt: skip
    record = timer.finish(10**9, **meta)
    assert {k: getattr(record, k) for k in meta} == meta
    assert record.duration_s == 1.0 and record.ttft_s == pytest.approx(0.1)
    assert record.token_source is TokenSource.USAGE and record.chunks == 3
    assert (record.itl_count, record.stalls) == (2.0, 0)
    assert record.itl_sum == pytest.approx(0.04) and record.itl_max == pytest.approx(0.02)
    assert record.itl_sumsq == pytest.approx(0.0008) and record.smoothness == pytest.approx(1.0)
    assert record.tpot_s == pytest.approx(0.04 / 12)
    assert len(record) == len(RequestStats._fields) == 30


# Edges of the rules, on literal numbers: gaps that are binary fractions of a second, so the
# numbers are exact and compared with ``==``.


@pytest.mark.parametrize("spread", [stats.spread_list, stats.spread_tokens])
def test_tokens_are_spread_as_evenly_as_whole_numbers_allow(
    spread: Callable[[int, int], Iterable[float]],
) -> None:
    assert list(spread(7, 3)) == [3.0, 2.0, 2.0]  # the odd ones to the earliest chunks
    assert list(spread(6, 3)) == [2.0, 2.0, 2.0]
    assert list(spread(5, 1)) == [5.0]
    assert list(spread(0, 3)) == [0.0, 0.0, 0.0]
    assert list(spread(-4, 2)) == [0.0, 0.0]  # never fewer than none
    assert list(spread(5, 0)) == []


def both_windows(
    times_ms: list[int], tokens: list[float] | None = None, **knobs: float | None
) -> list[TokenWindow]:
    """The window of chunks at ``times_ms`` by either path: plain Python, then numpy."""
    times = [t * MS for t in times_ms]
    options = {"factor": 3.0, "min_gap": 0.05, **knobs}
    array = None if tokens is None else np.array(tokens, dtype=np.float64)
    return [
        stats.small_window(times, tokens, **options),  # type: ignore[arg-type]
        stats.token_window(np.array(times, dtype=np.int64), array, **options),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("times_ms", "threshold"),
    [
        ([0, 250, 500, 750, 1_500], 0.75),  # 3 x the median gap of 250 ms
        ([0, 10, 20, 30, 80], 0.05),  # 3 x 10 ms is under min_gap, 50 ms
    ],
)
def test_a_gap_exactly_at_the_stall_line_is_a_stall(times_ms: list[int], threshold: float) -> None:
    for window in both_windows(times_ms):
        assert window.stall_threshold == threshold
        assert window.stalls == 1
    for window in both_windows([*times_ms[:-1], times_ms[-1] - 1]):  # a millisecond shorter
        assert window.stalls == 0


def test_a_window_of_one_gap_is_judged_against_the_median_before_it() -> None:
    for window in both_windows([1_000, 2_000], baseline_median=0.25):
        assert window.itl.tolist() == [1.0] and window.tokens == 1.0
        assert (window.itl_sum, window.itl_sumsq, window.itl_max) == (1.0, 1.0, 1.0)
        assert (window.median_gap, window.stall_threshold, window.stalls) == (0.25, 0.75, 1)
    for window in both_windows([1_000, 2_000]):  # nothing before it: no rhythm to break
        assert (window.median_gap, window.stall_threshold, window.stalls) == (None, None, 0)


def test_a_window_without_gaps_is_empty_and_keeps_the_median_before_it() -> None:
    windows = [
        stats.small_window([5 * MS], None, factor=3.0, min_gap=0.05, baseline_median=0.25),
        stats.small_window([5 * MS], [], factor=3.0, min_gap=0.05, baseline_median=0.25),
        stats.small_window([], [], factor=3.0, min_gap=0.05, baseline_median=0.25),
    ]
    for times in ([5 * MS], []):
        for tokens in (None, np.zeros(0)):
            windows.append(
                stats.token_window(
                    np.array(times, dtype=np.int64), tokens,
                    factor=3.0, min_gap=0.05, baseline_median=0.25,
                )
            )  # fmt: skip
    bounds = [0.1, 1.0]
    for window in windows:
        assert (window.size, window.stalls, window.median_gap, window.tokens) == (0, 0, 0.25, 0.0)
        assert window.itl.tolist() == [] and window.weights.tolist() == []
        series = [0.0, 0.0, 0.0]
        fill_classic(window, bounds, np.array(bounds), series)  # bins into nothing
        assert series == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("gaps", [3, 9])  # fewer than 8 values summed, and more
def test_token_counts_of_another_length_than_the_chunks_are_refused(gaps: int) -> None:
    times = [250 * MS * i for i in range(gaps + 1)]
    counts = [2.0] * (gaps - 1)  # one chunk short
    with pytest.raises(ValueError, match="shorter"):  # not cut silently to the shorter
        stats.small_window(times, counts, factor=3.0, min_gap=0.05)
    with pytest.raises(ValueError, match="broadcast"):
        stats.token_window(np.array(times), np.array(counts), factor=3.0, min_gap=0.05)


def test_a_stream_of_equal_times_has_no_smoothness() -> None:
    """All gaps zero (a burst): no variation to score, and no division by zero."""
    assert stats.smoothness(4, 0.0, 0.0) is None
    timer, _ = run([MS] * 5)
    assert finish(timer, 10 * MS).smoothness is None


def test_a_steady_stream_scores_exactly_one() -> None:
    """The sums of five 20 ms gaps round to a ratio a hair above 1; smoothness stays 1."""
    assert (0.1 * 0.1) / (5 * 0.002) > 1.0
    assert stats.smoothness(5, 0.1, 0.002) == 1.0
    timer, _ = run(schedule([20.0] * 5))
    assert finish(timer, 10**10).smoothness == 1.0


def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it() -> None:
    assert stats.tpot(1_000 * MS, 1_250 * MS, 2) == 0.25
    assert stats.tpot(1_000 * MS, 1_500 * MS, 5) == 0.125
    assert stats.tpot(1_000 * MS, 1_000 * MS, 1) is None  # one token: nothing after it
    assert stats.tpot(None, 1_000 * MS, 5) is None
    assert stats.tpot(1_000 * MS, None, 5) is None
