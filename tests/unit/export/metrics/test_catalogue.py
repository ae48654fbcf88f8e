"""The catalogue: every metric exposed with its labels, no name twice, every one in the docs."""

from __future__ import annotations

import re

from llmobs.export.metrics.catalogue import (
    API_METRICS,
    CATALOGUE,
    COLLECTOR_METRICS,
    COST,
    LATEST_USAGE,
    PD_METRICS,
    PROCESS_METRICS,
    SATURATION_METRICS,
    SESSION_METRICS,
    TOKEN_USAGE,
    TRANSPORT_METRICS,
    Kind,
    status_class,
)
from tests.support.metrics import (
    DOCS,
    exposition,
)


def test_every_catalogue_metric_is_exposed_with_its_labels() -> None:
    """The token usage of v1.41's conventions by default, the newest's when opted in, never
    both (OTEL_SEMCONV_STABILITY_OPT_IN: names switch, they are not emitted twice)."""
    default, latest = exposition(), exposition(latest=True)
    for metric in CATALOGUE:
        absent = default if metric in LATEST_USAGE else latest if metric is TOKEN_USAGE else ""
        assert not absent or f"\n{metric.prometheus}" not in absent, metric.prometheus
        if metric in COLLECTOR_METRICS or metric in PROCESS_METRICS:  # tests/e2e/test_collectors.py
            continue
        if metric in TRANSPORT_METRICS:  # only with TLS on: tests/e2e/test_tls.py
            continue
        if metric in SESSION_METRICS:  # once a session ran: tests/e2e/test_websocket.py
            continue
        if metric in PD_METRICS:  # once a leg ran: tests/e2e/test_disaggregated.py
            continue
        if metric in API_METRICS:  # the app's consumer: tests/e2e/test_grpc.py
            continue
        if metric in SATURATION_METRICS:  # the app's backlogs: tests/e2e/test_saturation.py
            continue
        if metric is COST:  # only with a price file: tests/e2e/test_tenants.py
            continue
        # every other family in both modes: opting in switches the token usage alone
        texts = [default] if metric is TOKEN_USAGE else [latest] if metric in LATEST_USAGE else [
            default, latest]  # fmt: skip
        for text in texts:
            suffix = "_bucket" if metric.kind in (Kind.HISTOGRAM, Kind.TOKEN_HISTOGRAM) else ""
            pattern = "^" + re.escape(metric.prometheus + suffix) + r"(\{[^}]*\})? "
            lines = [m.group(0) for m in re.finditer(pattern, text, re.MULTILINE)]
            assert lines, metric.prometheus
            if metric.kind is not Kind.UPDOWN and metric.labels:
                for label in metric.prometheus_labels:
                    assert f'{label}="' in lines[0], (metric.prometheus, label)


def test_no_prometheus_name_is_defined_twice() -> None:
    names = [m.prometheus for m in CATALOGUE]
    assert len(names) == len(set(names))


def test_docs_list_every_metric() -> None:
    docs = DOCS.read_text()
    for metric in CATALOGUE:
        assert f"`{metric.prometheus}`" in docs, metric.prometheus


def test_status_class() -> None:
    assert [status_class(s) for s in (0, 200, 404, 502, 999)] == ["0xx", "2xx", "4xx", "5xx", "0xx"]
