"""OpenTelemetry SDK setup: the only module that builds providers and exporters.

Each sidecar (and each test) gets its own ``CollectorRegistry`` and ``MeterProvider``: nothing
global, so tests can build many side by side. The Prometheus reader is configured without
``target_info`` and without ``otel_scope_*`` labels, which would only add noise to every series.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from llmobs import __version__

SCOPE = "llmobs"


@dataclass(frozen=True)
class Telemetry:
    """A registry to scrape, the meter provider that feeds it, and its meter."""

    registry: CollectorRegistry
    meter_provider: MeterProvider
    meter: Meter

    def shutdown(self) -> None:
        self.meter_provider.shutdown()


def build_telemetry(registry: CollectorRegistry | None = None) -> Telemetry:
    """A fresh meter provider exporting to ``registry`` (a new one when not given)."""
    registry = registry if registry is not None else CollectorRegistry()
    reader = PrometheusMetricReader(
        disable_target_info=True, scope_info_enabled=False, registry=registry
    )
    provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource({"service.name": "llmobs", "service.version": __version__}),
    )
    return Telemetry(registry, provider, provider.get_meter(SCOPE, __version__))
