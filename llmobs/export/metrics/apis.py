"""Each request's API and transport into their family (``catalogue.API_METRICS``).

A consumer of request records, as ``pd`` is: one counter on the scraped meter, by the API a
request spoke (its route's dialect, a closed set), its transport (gRPC or HTTP), its outcome
and its gRPC status (one of gRPC's 17 codes, or none). The request families count every API
alike; this one says which API and transport they came over.
"""

from __future__ import annotations

from opentelemetry.metrics import Meter

from llmobs.export.metrics.catalogue import API, API_REQUESTS, GRPC_STATUS, OUTCOME, TRANSPORT
from llmobs.export.metrics.otel import counter_of
from llmobs.observe.labels import OTHER
from llmobs.observe.record import RequestRecord

NONE = "none"
_CODES = {code: str(code) for code in range(17)}  # gRPC's codes: a closed set


class ApiMetrics:
    """The API family on ``meter``."""

    def __init__(self, meter: Meter) -> None:
        self._requests = counter_of(meter, API_REQUESTS)

    def consume(self, record: RequestRecord) -> None:
        """A finished request, under its API, transport, outcome and gRPC status."""
        stats = record.stats
        code = stats.grpc_status
        grpc = code is not None or stats.dialect == "grpc" or stats.dialect.endswith("-grpc")
        status = NONE if code is None else _CODES.get(code, OTHER)
        self._requests.add(1, {
            API: stats.dialect, TRANSPORT: "grpc" if grpc else "http",
            OUTCOME: stats.outcome._value_, GRPC_STATUS: status,
        })  # fmt: skip
