"""The configuration said at start (``announce``): each line from the settings and what the
sidecar read of its files, and the warning for a latency objective that looks like
milliseconds given without a unit. Through ``llmobs serve``: tests/e2e/test_cli.py."""

from __future__ import annotations

from pathlib import Path

from llmobs.announce import configuration, unit_warnings
from llmobs.config.settings import Settings


def _lines(settings: Settings) -> list[str]:
    return configuration(settings, settings.objectives(), settings.tenancy(), settings.prices())


def test_the_defaults() -> None:
    assert _lines(Settings()) == [
        "objectives: availability only (no latency bound set); target 99.90% over 28d (flags)",
        "tenants: off (--tenant-header, --tenant-keys)",
        "prices: off (--price-file)",
        "collectors: GPU every 1s; the engine's http://127.0.0.1:8000/metrics every 5s",
        "transports: clients HTTP/1.1 and HTTP/2 (h2c), WebSocket (messages to 16777216 "
        "bytes, idle 300 s); metrics port plain HTTP; engine plain HTTP",
    ]


def test_what_was_set_and_where_it_came_from(tmp_path: Path) -> None:
    slo, prices = tmp_path / "slo.yaml", tmp_path / "prices.yaml"
    slo.write_text("objectives:\n  - model: a\n    ttft: 1s\n  - model: b\n    ttft: 2s\n")
    prices.write_text("currency: EUR\nprices:\n  '*': {input: 0.5, output: 1.5}\n")
    settings = Settings(
        slo_ttft=0.5, slo_no_stalls=True, slo_target=0.99, slo_file=str(slo),
        tenant_header="X-Team", price_file=str(prices), gpu_sample_interval=0,
        engine_scrape_interval=0, http2=False, upstream="https://engine:8443",
        upstream_insecure_skip_verify=True, websocket=False, upstream_http2=True,
    )  # fmt: skip
    assert _lines(settings) == [
        "objectives: TTFT <= 500ms, no stalls; target 99.00% over 28d (flags); 2 overrides "
        f"from --slo-file {slo}",
        "tenants: by the X-Team header; on requests, ttft, slo, tokens, cost",
        f"prices: 1 model from --price-file {prices}, in EUR",
        "collectors: GPU off (--gpu-sample-interval 0); the engine's metrics off "
        "(--engine-scrape-interval 0)",
        "transports: clients HTTP/1.1; metrics port plain HTTP; engine https over HTTP/2, its "
        "certificate NOT checked",
    ]


def test_a_latency_objective_that_looks_like_milliseconds_is_warned_of() -> None:
    assert unit_warnings(Settings(slo_ttft=500, slo_tpot=0.05).objectives().default) == [
        "--slo-ttft / LLMOBS_SLO_TTFT is 500 seconds; if you meant milliseconds, write 500ms"
    ]
    assert unit_warnings(Settings(slo_ttft=30, slo_max_gap=2).objectives().default) == []
