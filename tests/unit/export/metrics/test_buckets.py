"""The classic buckets the operator sets (``--buckets``): read and checked at start-up, used
by the sink's histograms, the live page's ring and OTLP alike; the rest keep the catalogue's."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmobs.config.buckets import parse_buckets
from llmobs.config.options import ConfigError
from llmobs.config.settings import Settings
from llmobs.export.metrics.catalogue import ITL, TPOT, TTFT
from llmobs.export.metrics.sink import MetricsSink
from llmobs.export.ui import LivePage
from tests.support.metrics import replay


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


def test_the_sink_and_the_live_page_use_them() -> None:
    settings = Settings.from_sources({}, {"buckets": parse_buckets("ttft=0.1,0.8,2;itl=0.02,0.5")})
    registry = CollectorRegistry()
    sink = MetricsSink(registry, 4, buckets=settings.buckets)
    replay(sink, "llama", [20.0] * 9)
    text = generate_latest(registry).decode()
    ttft = [line for line in text.splitlines()
            if line.startswith("gen_ai_server_time_to_first_token_seconds_bucket{")
            and 'model="llama"' in line]  # fmt: skip
    assert [line.split('le="')[1].split('"')[0] for line in ttft] == ["0.1", "0.8", "2.0", "+Inf"]
    itl = [line for line in text.splitlines()
           if line.startswith("llmobs_inter_token_latency_seconds_bucket{")
           and 'model="llama"' in line]  # fmt: skip
    assert len(itl) == 3 and 'le="0.02"' in itl[0]
    assert sink.define(TTFT).buckets == (0.1, 0.8, 2.0)
    assert sink.define(TPOT).buckets == TPOT.buckets  # not named: the catalogue's
    page = LivePage(sink)
    assert page.ring._ttft_bounds[:-1] == (0.1, 0.8, 2.0)
    assert sink.define(ITL).buckets == (0.02, 0.5)
