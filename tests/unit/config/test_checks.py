"""What a valid value is (``config.checks``): each check names what is wrong, or nothing."""

from __future__ import annotations

import math

import pytest

from llmobs.config.checks import (
    Check,
    at_least_one,
    between,
    fraction,
    http_url,
    matches,
    non_negative,
    not_blank,
    one_of,
    positive,
    tcp_port,
    unless_empty,
)


@pytest.mark.parametrize(
    ("check", "good", "bad", "problem"),
    [
        (positive, [1e-9, 3.0], [0, -1.0, math.nan], "must be > 0, got "),
        (non_negative, [0, 0.0, 7], [-1e-9, math.nan], "must be >= 0, got "),
        (at_least_one, [1, 32], [0, -3], "must be >= 1, got "),
        (tcp_port, [0, 80, 65535], [-1, 65536], "port out of range: "),
        (fraction, [0.0, 0.5, 1.0], [-0.1, 1.01, math.nan], "must be within [0, 1], got "),
        (between(10, 3600, "seconds"), [10, 3600], [9, 3601], "must be 10 to 3600 seconds, got"),
    ],
)
def test_a_bound_names_itself_and_the_value(
    check: Check, good: list[float], bad: list[float], problem: str
) -> None:
    for value in good:
        assert check(value) is None, value
    for value in bad:
        found = check(value)
        assert found is not None and found.startswith(problem), (value, found)
        assert found.endswith(str(value)), found


def test_a_choice_is_from_a_closed_set() -> None:
    levels = one_of(("debug", "info"))
    assert levels("info") is None
    assert levels("INFO") == "expected one of debug, info, got 'INFO'"
    assert one_of(("debug", "info"), fold=True)("INFO") is None


def test_text_is_whole_matched() -> None:
    name = matches(r"[a-z]+", "lower-case letters")
    assert name("vllm") is None
    assert name("vllm 2") == "expected lower-case letters, got 'vllm 2'"
    assert name("") == "expected lower-case letters, got ''"


def test_urls_are_http_with_a_host() -> None:
    for good in ("http://engine:8000", "https://a.b/metrics"):
        assert http_url(good) is None
    for bad in ("", "ftp://x", "engine:8000", "http://", "http:///path"):
        assert http_url(bad) == f"expected an http(s) URL, got {bad!r}"


def test_an_empty_value_can_mean_unset() -> None:
    optional = unless_empty(http_url)
    assert optional("") is None
    assert optional("x") == "expected an http(s) URL, got 'x'"


def test_a_name_must_say_something() -> None:
    assert not_blank("llama") is None
    assert not_blank(" \t") == "must not be empty"
