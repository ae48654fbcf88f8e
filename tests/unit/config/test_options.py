"""Options declared once (``config.options``): the parsers of a value, the flag and variable
a field becomes, their precedence, the checks run naming both, and the defaults as shown."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmobs.config.checks import positive
from llmobs.config.options import (
    ConfigError,
    add_arguments,
    check_fields,
    flags_of,
    merge_sources,
    option,
    options_of,
    parse_bool,
    parse_duration,
    parse_list,
    parse_quantity,
    parse_size,
    read_yaml,
    shown_default,
    source_of,
)
from llmobs.config.settings import OPTIONS
from llmobs.sim.config import SIM_OPTIONS


@dataclass(frozen=True)
class Knobs:
    """A settings class of its own: what the machinery makes of any such declaration."""

    max_wait: float = option(2.0, parse_duration, "longest wait", "DURATION", check=positive)
    verbose: bool = option(False, parse_bool, "say more", "BOOL")
    token: str = option("", str, "a secret", "TOKEN", secret=True)
    not_an_option: int = 7


KNOBS = options_of(Knobs, "KNOB_")


def test_a_field_is_a_flag_and_a_variable() -> None:
    assert [(o.field, o.flag, o.env, o.metavar) for o in KNOBS] == [
        ("max_wait", "--max-wait", "KNOB_MAX_WAIT", "DURATION"),
        ("verbose", "--verbose", "KNOB_VERBOSE", "BOOL"),
        ("token", "--token", "KNOB_TOKEN", "TOKEN"),
    ]
    assert source_of("max_wait", KNOBS) == "--max-wait / KNOB_MAX_WAIT"
    assert source_of("not_an_option", KNOBS) == "not_an_option"
    assert "token" not in repr(Knobs(token="s3cret")) and "s3cret" not in repr(Knobs())


def test_a_flag_wins_over_the_variable_which_wins_over_the_default() -> None:
    env = {"KNOB_MAX_WAIT": "5m", "KNOB_VERBOSE": "yes"}
    assert merge_sources(KNOBS, env, {"max_wait": "1s", "verbose": None}) == {
        "max_wait": 1.0, "verbose": True}  # fmt: skip
    assert merge_sources(KNOBS, {}, None) == {}  # the defaults are the dataclass'
    assert merge_sources(KNOBS, {}, {"max_wait": 0.5}) == {"max_wait": 0.5}  # typed: as given


def test_a_value_that_does_not_parse_names_where_it_came_from() -> None:
    """Named by where it came from, the value echoed as given, the forms it may take: never
    Python's own words (``could not convert string to float``, ``invalid literal``)."""
    with pytest.raises(ConfigError) as caught:
        merge_sources(KNOBS, {"KNOB_MAX_WAIT": "2 seconds"}, None)
    assert str(caught.value) == (
        "KNOB_MAX_WAIT: '2 seconds' is not a duration: give seconds (2.5) or a number with a "
        "unit: 500ms, 2s, 5m, 1h, 28d, 1w"
    )
    with pytest.raises(ConfigError, match=r"^--verbose: 'maybe' is not true or false"):
        merge_sources(KNOBS, {}, {"verbose": "maybe"})


def test_a_check_names_the_flag_and_the_variable() -> None:
    check_fields(Knobs(), KNOBS)
    with pytest.raises(ConfigError, match=r"^--max-wait / KNOB_MAX_WAIT: must be > 0, got 0"):
        check_fields(Knobs(max_wait=0.0), KNOBS)


def test_the_parser_gets_each_flag_with_its_variable_and_default() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, KNOBS)
    text = parser.format_help()
    assert "longest wait [env KNOB_MAX_WAIT; default 2s]" in text
    assert "--verbose, --no-verbose" in text
    assert "a secret [env KNOB_TOKEN]" in text  # no default to show
    args = parser.parse_args(["--no-verbose"])
    assert flags_of(args, KNOBS) == {"max_wait": None, "verbose": False, "token": None}


def test_every_default_shown_reads_back_as_the_default() -> None:
    for opt in (*OPTIONS, *SIM_OPTIONS):
        shown = shown_default(opt)
        if shown is None:
            assert opt.default in (None, "", ()), opt.flag
            continue
        assert opt.parse(shown) == opt.default, (opt.flag, shown)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("2s", 2.0), ("1.5", 1.5), ("5m", 300.0), ("6h", 21600.0),
     ("28d", 2419200.0), ("1w", 604800.0), (" 3 s ", 3.0)],
)  # fmt: skip
def test_durations_read_as_prometheus_spells_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ms", "soon", "inf", "nan s", "5 minutes"])
def test_what_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"convert|duration"):
        parse_duration(text)


def test_sizes_quantities_booleans_and_lists() -> None:
    assert [parse_size(t) for t in ("300", "16MiB", "2k", "1 GiB", "1.5m")] == [
        300, 16 << 20, 2048, 1 << 30, 3 << 19]  # fmt: skip
    assert [parse_quantity(t) for t in ("8B", "3.35T", "989e12", "1_000")] == [
        8e9, 3.35e12, 989e12, 1000.0]  # fmt: skip
    assert [parse_bool(t) for t in ("1", " TRUE ", "on", "no", "Off", "0")] == [
        True, True, True, False, False, False]  # fmt: skip
    with pytest.raises(ValueError, match="is not true or false"):
        parse_bool("maybe")
    assert parse_list(" a, ,b ,") == ("a", "b")


def test_a_file_that_cannot_be_read_names_the_flag_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="^" + re.escape(f"--some-file {path}: ")):
        read_yaml(path, "--some-file")
    with pytest.raises(ConfigError, match=r"--some-file .*missing\.yaml"):
        read_yaml(tmp_path / "missing.yaml", "--some-file")
    path.write_text("a: [1, 2]\n")
    assert read_yaml(str(path), "--some-file") == {"a": [1, 2]}


def test_a_yaml_file_that_does_not_parse_is_named_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "slo.yaml"
    bad.write_text("objectives:\n  - model: [a\n    ttft: 2s\n")
    with pytest.raises(ConfigError) as caught:
        read_yaml(bad, "--slo-file")
    said = str(caught.value)
    assert said.startswith(f"--slo-file {bad}: line 3, column 9: ")
    assert said.endswith(": not valid YAML") and "<unicode string>" not in said
    with pytest.raises(ConfigError, match=r"nowhere.yaml: cannot be read \(No such file"):
        read_yaml(tmp_path / "nowhere.yaml", "--price-file")
