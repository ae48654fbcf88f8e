"""The classic buckets the operator sets (``config.buckets``, ``--buckets``): read in the
families' order, and a bad spec refused at start-up naming the flag and the variable. Their use
by the sink and the live page: ``tests/unit/export/metrics/test_buckets.py``."""

from __future__ import annotations

import pytest

from llmobs.config.buckets import FAMILIES, MAX_BUCKETS, parse_buckets
from llmobs.config.options import ConfigError
from llmobs.config.settings import Settings


def test_the_spec_is_read_in_the_families_order() -> None:
    assert parse_buckets("itl=0.01,0.05; TTFT = 0.1, 0.8 ,2;") == (
        ("ttft", (0.1, 0.8, 2.0)), ("itl", (0.01, 0.05)))  # fmt: skip
    assert parse_buckets("") == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttfb=0.1", "a family of ttft, phases, tpot, duration, itl"),
        ("ttft", "expected family=b1,b2"),
        ("ttft=0.1;ttft=0.2", "ttft is given twice"),
        ("ttft=", "between 1 and 64 bounds"),
        ("ttft=" + ",".join(str(i + 1) for i in range(65)), "between 1 and 64 bounds"),
        ("ttft=0.1,x", "bounds are numbers of seconds"),
        ("ttft=0,1", "finite and above 0"),
        ("ttft=1,inf", "finite and above 0"),
        ("ttft=1,nan", "finite and above 0"),
        ("ttft=1,1", "strictly ascending"),
        ("ttft=2,1", "strictly ascending"),
    ],
)
def test_a_bad_spec_stops_the_start_naming_the_flag(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Settings.from_sources({"LLMOBS_BUCKETS": spec})
    assert "LLMOBS_BUCKETS" in str(caught.value)


def test_every_family_can_be_named_with_as_many_bounds_as_allowed() -> None:
    bounds = tuple(float(i + 1) for i in range(MAX_BUCKETS))
    spec = ";".join(f"{family}=" + ",".join(map(str, bounds)) for family in reversed(FAMILIES))
    assert parse_buckets(spec) == tuple((family, bounds) for family in FAMILIES)
    flag = Settings.from_sources({}, {"buckets": "itl=0.5"})
    assert flag.buckets == (("itl", (0.5,)),)
