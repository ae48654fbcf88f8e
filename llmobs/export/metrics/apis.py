"""Each request's API and transport into their family (``catalogue.API_METRICS``).

A consumer of request records, as ``pd`` is: one counter on the scraped meter, by the API a
request spoke (its route's dialect, a closed set), its transport (gRPC or HTTP), its outcome
and its gRPC status (one of gRPC's 17 codes, or none). The request families count every API
alike; this one says which API and transport they came over. Counted in a dict and read when
scraped (an observable counter): an OpenTelemetry ``Counter.add`` per request would cost
more than the rest of the request's bookkeeping (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmobs.export.metrics.catalogue import API, API_REQUESTS, GRPC_STATUS, OUTCOME, TRANSPORT
from llmobs.observe.labels import OTHER
from llmobs.observe.record import RequestRecord

NONE = "none"
_CODES = {code: str(code) for code in range(17)}  # gRPC's codes: a closed set
Key = tuple[str, str, str, str]  # api, transport, outcome, gRPC status


class ApiMetrics:
    """The API family on ``meter``."""

    def __init__(self, meter: Meter) -> None:
        self.counts: dict[Key, int] = {}
        meter.create_observable_counter(
            API_REQUESTS.name, [self._observe], API_REQUESTS.unit, API_REQUESTS.description
        )

    def consume(self, record: RequestRecord) -> None:
        """A finished request, under its API, transport, outcome and gRPC status."""
        stats = record.stats
        code, api = stats.grpc_status, stats.dialect
        grpc = code is not None or api[-4:] == "grpc"  # grpc, or an engine's: vllm-grpc ...
        key = (
            api, "grpc" if grpc else "http", stats.outcome._value_,
            NONE if code is None else _CODES.get(code, OTHER),
        )  # fmt: skip
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        """The counts so far, read when scraped."""
        return [
            Observation(n, {API: api, TRANSPORT: transport, OUTCOME: outcome, GRPC_STATUS: code})
            for (api, transport, outcome, code), n in list(self.counts.items())
        ]
