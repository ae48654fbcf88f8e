"""The autoscaling proof's controller does the HPA's arithmetic (its replica calculator and
its default behaviour), so that what the proof shows holds for a real HPA or KEDA."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("autoscale", ROOT / "benchmarks" / "autoscale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["autoscale"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


autoscale = _harness()
CONTROL = autoscale.Control()
AVERAGE = autoscale.Signal("average", "q", 0.7)  # HPA's Value
TOTAL = autoscale.Signal("total", "q", 0.5, total=True)  # HPA's AverageValue


@pytest.mark.parametrize(
    ("current", "ready", "value", "desired"),
    [
        (4, 4, 1.0, 6),  # ceil(4 x 1.0 / 0.7) = ceil(5.71)
        (4, 4, 0.35, 2),  # half the target: half the pods
        (4, 4, 0.76, 4),  # within the 10 % tolerance: no change
        (4, 4, 0.78, 5),  # just outside it
        (6, 4, 1.0, 6),  # two still starting: ready pods x ratio, not current x ratio
        (6, 2, 0.7, 6),  # at the target while pods start: no change
        (1, 1, 10.0, 8),  # never above the maximum
        (3, 3, 0.0, 1),  # nor below the minimum
    ],
)
def test_value_targets_scale_the_ready_pods(current: int, ready: int, value: float,
                                            desired: int) -> None:  # fmt: skip
    assert autoscale.recommend(AVERAGE, current, ready, value, CONTROL) == desired


@pytest.mark.parametrize(
    ("current", "ready", "value", "desired"),
    [
        (2, 2, 2.2, 5),  # ceil(2.2 / 0.5)
        (2, 1, 2.2, 5),  # a total needs no pod count
        (4, 4, 2.1, 4),  # 2.1 / (0.5 x 4) = 1.05: within the tolerance
        (4, 4, 1.0, 2),
        (4, 2, 2.1, 4),  # the tolerance is on every pod, starting ones too: 2.1 / (0.5 x 4)
    ],
)
def test_average_value_targets_divide_the_total(current: int, ready: int, value: float,
                                                desired: int) -> None:  # fmt: skip
    assert autoscale.recommend(TOTAL, current, ready, value, CONTROL) == desired


def test_scale_up_at_once_down_to_the_windows_highest() -> None:
    assert autoscale.stabilised([2, 3, 5], 3, 8) == 5  # up: the latest
    assert autoscale.stabilised([2, 3, 7], 3, 5) == 5  # as far as the policies allow
    assert autoscale.stabilised([6, 4, 2], 5, 8) == 5  # down: the window's highest (6), capped
    assert autoscale.stabilised([6, 4, 2], 8, 8) == 6
    assert autoscale.stabilised([3, 3, 3], 5, 8) == 3
    assert autoscale.stabilised([9], 5, 4) == 5  # a limit below the count removes nothing


def test_the_default_scale_up_policy_doubles_or_adds_four_a_period() -> None:
    policies = CONTROL.up_policies
    assert autoscale.scale_up_limit(1, [], 100.0, policies) == 5  # 1 + 4
    assert autoscale.scale_up_limit(6, [], 100.0, policies) == 12  # 6 + 100 %
    # 3 of the 7 came within the period: from the 4 at its start, 8
    assert autoscale.scale_up_limit(7, [(99.0, 3)], 100.0, policies) == 8
    assert autoscale.scale_up_limit(7, [(90.0, 3)], 100.0, policies) == 14  # (an older step)


def test_a_slow_policy_counts_the_pods_added_in_its_period() -> None:
    two_per_24s = [("Pods", 2, 24.0)]
    assert autoscale.scale_up_limit(3, [], 50.0, two_per_24s) == 5
    assert autoscale.scale_up_limit(5, [(40.0, 2)], 50.0, two_per_24s) == 5  # spent
    assert autoscale.scale_up_limit(5, [(20.0, 2)], 50.0, two_per_24s) == 7  # its period over


def test_a_sweep_runs_each_signal_at_each_target() -> None:
    chosen = autoscale.signals("15s")[:2]
    swept = autoscale.swept(chosen, [f"{chosen[1].name}=0.2,0.4"])
    assert [(s.name, s.target) for s in swept] == [
        (chosen[0].name, chosen[0].target), (chosen[1].name, 0.2), (chosen[1].name, 0.4),
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="no chosen signal"):
        autoscale.swept(chosen, ["nothing=1"])


def test_misses_are_counted_in_the_phase_they_were_sent_in() -> None:
    Outcome = autoscale.Outcome
    night, ramp = autoscale.DAY[0], autoscale.DAY[1]
    speed = 0.5
    edge = night.seconds * speed  # the ramp's first instant
    outcomes = [Outcome(0.0, 1.0, False), Outcome(edge - 0.01, edge, False),
                Outcome(edge, edge + 1, False), Outcome(edge + 1, edge + 2, True),
                Outcome(1e6, 1e6, False)]  # fmt: skip
    missed = autoscale.missed_by_phase(outcomes, speed)
    assert missed[night.name] == 2 and missed[ramp.name] == 1
    assert missed[autoscale.DAY[-1].name] == 1  # (after the day: its last phase)
    assert sum(missed.values()) == 4


@pytest.mark.parametrize("speed", [1.0, 0.5])
def test_every_knob_is_compressed_with_the_day(speed: float) -> None:
    control = autoscale.compressed(speed)
    assert control.period == pytest.approx(3.0 * speed)  # the HPA's 15 s sync
    assert control.down_window == pytest.approx(60.0 * speed)  # its 300 s window
    assert control.startup == pytest.approx(15.0 * speed)
    # the default scale-up policies' periods are the sync's, at any speed
    assert [p[2] for p in control.up_policies] == [pytest.approx(control.period)] * 2


def test_a_scale_up_policy_of_ones_own_is_compressed_with_the_day() -> None:
    assert autoscale.pods_policy("2/120", 0.5) == ("Pods", 2.0, pytest.approx(12.0))
    for bad in ("2", "two/120", "0/120", "2/0"):
        with pytest.raises(SystemExit, match="--scale-up"):
            autoscale.pods_policy(bad, 1.0)
