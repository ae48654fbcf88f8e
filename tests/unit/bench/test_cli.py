"""``llmobs bench``'s flags (``bench.cli``): the defaults are ``BenchOptions``', shown as a user
types them, and a mistake fails before anything is started."""

from __future__ import annotations

import argparse

import pytest

from llmobs.bench.cli import add_bench_arguments, options_from_args
from llmobs.bench.runner import BenchOptions


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(argv)


def test_no_flag_is_the_default_options() -> None:
    assert options_from_args(_parse()) == BenchOptions()


def test_flags_set_the_options() -> None:
    options = options_from_args(_parse(
        "--targets", "llmobs,direct", "--concurrency", "1, 8", "--tpot", "0.02",
        "--arrival-rate", "50", "--no-saturation", "--saturation-tokens", "30,5",
    ))  # fmt: skip
    assert (options.targets, options.concurrency, options.tpot) == (
        ("llmobs", "direct"), (1, 8), 0.02)  # fmt: skip
    assert (options.arrival_rate, options.saturation, options.saturation_tokens) == (
        50.0, False, (30, 5))  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--saturation-tokens", "30"), "--saturation-tokens takes two different lengths"),
        (("--saturation-tokens", "5,5"), "--saturation-tokens takes two different lengths"),
        (("--concurrency", "0,4"), "--concurrency and --rounds must be >= 1"),
        (("--rounds", "0"), "--concurrency and --rounds must be >= 1"),
    ],
)
def test_a_mistake_fails_before_a_run(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        options_from_args(_parse(*argv))


def test_an_unknown_target_is_refused_naming_the_known(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _parse("--targets", "llmobs,haproxy")
    assert "unknown target 'haproxy' (known: " in capsys.readouterr().err


def test_defaults_are_shown_as_typed() -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "concurrent streams per cell [1,16,128,512]" in text
    assert "[0.01]" in text and "only the paced cells [on]" in text
