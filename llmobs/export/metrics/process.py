"""The sidecar's own cost and build on /metrics: ``process_*`` (CPU seconds, resident memory,
open fds, start time), ``python_info`` and ``python_gc_*`` from prometheus_client's collectors,
and ``llmobs_build_info``. For a sidecar, its own CPU and memory next to the traffic it carries
is the first thing an SRE checks."""

from __future__ import annotations

import platform
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from llmobs import __version__
from llmobs.export.metrics.catalogue import BUILD_INFO
from llmobs.observe.dialects.base import JSON_PARSER


class BuildInfo(Collector):
    """``llmobs_build_info{version, python, event_loop, json} 1``. The event loop is known
    once the sidecar runs on one (``event_loop``: "uvloop", "asyncio"; "none" before)."""

    def __init__(self) -> None:
        self.event_loop = "none"

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            BUILD_INFO.prometheus, BUILD_INFO.description, labels=BUILD_INFO.prometheus_labels
        )
        labels = [__version__, platform.python_version(), self.event_loop, JSON_PARSER]
        family.add_metric(labels, 1)
        yield family

    def describe(self) -> Iterable[Metric]:
        return ()


def register(registry: CollectorRegistry) -> BuildInfo:
    """The process, platform and GC collectors and the build info, on ``registry``."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = BuildInfo()
    registry.register(info)
    return info
