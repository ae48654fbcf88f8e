"""The classic buckets the operator sets (``--buckets``; read and checked at start-up:
``tests/unit/config/test_buckets.py``), used by the sink's histograms, the live page's ring and
OTLP alike; the rest keep the catalogue's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from llmobs.config.buckets import parse_buckets
from llmobs.config.settings import Settings
from llmobs.export.metrics.catalogue import ITL, TPOT, TTFT
from llmobs.export.ui import LivePage
from tests.support.metrics import replay
from tests.support.recording import recording


def test_the_sink_and_the_live_page_use_them() -> None:
    settings = Settings.from_sources({}, {"buckets": parse_buckets("ttft=0.1,0.8,2;itl=0.02,0.5")})
    registry = CollectorRegistry()
    sink, recorder = recording(registry, 4, buckets=settings.buckets)
    replay(recorder, "llama", [20.0] * 9)
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
