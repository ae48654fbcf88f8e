"""The transports' metrics (``export.metrics.transport``) as /metrics shows them: every
handshake result from the start, reloads by certificate, the expiry; nothing without TLS."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmobs.export.metrics.catalogue import TLS_EXPIRY, TLS_HANDSHAKES, TLS_RELOADS
from llmobs.export.metrics.transport import CLIENT, SERVING, TransportMetrics
from llmobs.export.telemetry import build_telemetry
from llmobs.wire.accept import RESULTS


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[str, ...]], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.startswith("llmobs_tls"):
                out[s.name, tuple(sorted(s.labels.values()))] = s.value
    return out


def test_no_tls_no_series() -> None:
    telemetry = build_telemetry()
    TransportMetrics(telemetry.meter, RESULTS)
    assert _samples(telemetry.registry) == {}


def test_each_result_counted_from_zero_and_the_expiry_shown() -> None:
    telemetry = build_telemetry()
    metrics = TransportMetrics(telemetry.meter, RESULTS)
    metrics.expires(SERVING, 2_000_000_000.0)
    metrics.handshake("ok")
    metrics.handshake("ok")
    metrics.handshake("plaintext")
    metrics.reloaded(SERVING, True)
    metrics.reloaded(SERVING, False)
    seen = _samples(telemetry.registry)
    handshakes = TLS_HANDSHAKES.prometheus
    assert {k[1][0]: v for k, v in seen.items() if k[0] == handshakes} == {
        **dict.fromkeys(RESULTS, 0.0),
        "ok": 2.0,
        "plaintext": 1.0,
    }
    assert seen[TLS_RELOADS.prometheus, ("ok", SERVING)] == 1
    assert seen[TLS_RELOADS.prometheus, ("error", SERVING)] == 1
    assert (TLS_RELOADS.prometheus, ("error", CLIENT)) not in seen  # no client certificate
    assert seen[TLS_EXPIRY.prometheus, (SERVING,)] == 2_000_000_000.0
    assert TLS_EXPIRY.prometheus == "llmobs_tls_certificate_expiration_timestamp_seconds"
