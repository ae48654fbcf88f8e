"""/metrics as scrapers fetch it: gzip when they take it (Prometheus always asks), in every
format, the same series as uncompressed; nothing compressed for one that does not."""

from __future__ import annotations

import gzip

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmobs.export.metrics.exposition import accepts_gzip
from tests.support.servers import SidecarFactory, SimFactory, eventually

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
PROTOBUF = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; " \
    "encoding=delimited"  # fmt: skip


async def fetch(url: str, encoding: str, accept: str = "") -> tuple[dict[str, str], bytes]:
    headers = {"Accept-Encoding": encoding, **({"Accept": accept} if accept else {})}
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.get(url + "/metrics", headers=headers) as r,
    ):
        assert r.status == 200
        return dict(r.headers), await r.read()


def families(text: bytes) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text.decode())}


def series(text: bytes) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every sample's name and labels (values change between two scrapes: the process's)."""
    return {(s.name, tuple(sorted(s.labels.items())))
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}  # fmt: skip


async def test_metrics_are_gzipped_for_a_scraper_that_takes_it(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim()
    # no GPU collector: its first poll, between two scrapes, would add a series to one
    side = await start_sidecar(sim.url, gpu_sample_interval=0)
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with session.post(side.url + "/v1/chat/completions", json=body) as r:
            await r.read()
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    plain_headers, plain = await fetch(side.metrics_url, "identity")
    assert "Content-Encoding" not in plain_headers
    headers, packed = await fetch(side.metrics_url, "gzip")
    assert headers["Content-Encoding"] == "gzip" and "Accept-Encoding" in headers["Vary"]
    text = gzip.decompress(packed)
    assert series(text) == series(plain) and "llmobs_requests" in families(text)
    assert len(packed) * 4 < len(text)  # the exposition is repetitive: it packs well
    for accept in (OPENMETRICS, PROTOBUF):
        headers, packed = await fetch(side.metrics_url, "gzip, deflate", accept)
        assert headers["Content-Encoding"] == "gzip"
        assert b"llmobs_requests" in gzip.decompress(packed)
    headers, _ = await fetch(side.metrics_url, "gzip;q=0, br")
    assert "Content-Encoding" not in headers


@pytest.mark.parametrize(
    ("header", "takes"),
    [
        ("gzip", True), ("GZIP", True), ("x-gzip", True), ("deflate, gzip;q=0.5", True),
        ("*", True), ("br, *;q=0.1", True), ("", False), ("identity", False),
        ("gzip;q=0", False), ("*;q=0", False), ("gzip;q=0, *", False), ("gzip;q=x", False),
        ("gzip;q=2", False),
    ],
)  # fmt: skip
def test_accept_encoding(header: str, takes: bool) -> None:
    assert accepts_gzip(header) is takes
