"""The sidecar's own cost and build (``export.metrics.process``) on a registry of its own:
every family the catalogue names for it, and ``llmobs_build_info`` saying the version, the
Python, the JSON parser and the event loop (``none`` until the sidecar runs on one).
tests/e2e/test_collectors.py reads them from a running sidecar's /metrics."""

from __future__ import annotations

import platform
import sys

from prometheus_client import CollectorRegistry

from llmobs import __version__
from llmobs.export.metrics import process
from llmobs.export.metrics.catalogue import BUILD_INFO, PROCESS_METRICS
from llmobs.observe.dialects.base import JSON_PARSER


def samples(registry: CollectorRegistry) -> dict[str, list[dict[str, str]]]:
    """Each sample name on ``registry``, with the label sets it has."""
    found: dict[str, list[dict[str, str]]] = {}
    for family in registry.collect():
        for sample in family.samples:
            found.setdefault(sample.name, []).append(dict(sample.labels))
    return found


def test_every_process_family_of_the_catalogue_is_registered() -> None:
    registry = CollectorRegistry()
    process.register(registry)
    names = samples(registry)
    for metric in PROCESS_METRICS:
        if metric.prometheus.startswith("process_") and not sys.platform.startswith("linux"):
            continue  # prometheus_client reads /proc
        assert metric.prometheus in names, metric.prometheus


def test_build_info_names_the_build_and_its_event_loop() -> None:
    registry = CollectorRegistry()
    info = process.register(registry)
    expected = {"version": __version__, "python": platform.python_version(),
                "event_loop": "none", "json": JSON_PARSER}  # fmt: skip
    assert samples(registry)[BUILD_INFO.prometheus] == [expected]
    assert set(expected) == set(BUILD_INFO.prometheus_labels)
    assert JSON_PARSER in ("orjson", "json")
    info.event_loop = "uvloop"
    running = {**expected, "event_loop": "uvloop"}
    assert samples(registry)[BUILD_INFO.prometheus] == [running]
    assert registry.get_sample_value(BUILD_INFO.prometheus, running) == 1
