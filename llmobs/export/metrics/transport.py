"""The transports' own metrics: TLS handshakes by result, certificate reloads, expiry.

Counts are kept here as plain integers and read by observable instruments at scrape time, as
the collectors' status is (``collectors.base.register_status``): a handshake costs a dict
increment, not an SDK call, and every result's series exists from the start at 0, so a
``rate()`` over the first failure is not lost to a series that appeared with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmobs.export.metrics.catalogue import (
    CERTIFICATE,
    RESULT,
    TLS_EXPIRY,
    TLS_HANDSHAKES,
    TLS_RELOADS,
)

SERVING: Final = "serving"  # the proxy port's (and the metrics port's) certificate
CLIENT: Final = "client"  # the one shown to the engine (mTLS)
CERTIFICATES = (SERVING, CLIENT)
RELOAD_OK, RELOAD_ERROR = "ok", "error"


class TransportMetrics:
    """What the wire tells of its TLS: ``handshake(result)``, ``reloaded(certificate,
    took)``, ``expires(certificate, when)``; exported through ``meter``."""

    def __init__(self, meter: Meter, results: Iterable[str]) -> None:
        self.handshakes = dict.fromkeys(results, 0)
        self.reloads = {(c, r): 0 for c in CERTIFICATES for r in (RELOAD_OK, RELOAD_ERROR)}
        self.expiry: dict[str, float] = {}
        meter.create_observable_counter(
            TLS_HANDSHAKES.name, [self._handshakes], unit=TLS_HANDSHAKES.unit,
            description=TLS_HANDSHAKES.description,
        )  # fmt: skip
        meter.create_observable_counter(
            TLS_RELOADS.name, [self._reloads], unit=TLS_RELOADS.unit,
            description=TLS_RELOADS.description,
        )  # fmt: skip
        meter.create_observable_gauge(
            TLS_EXPIRY.name, [self._expiry], unit=TLS_EXPIRY.unit,
            description=TLS_EXPIRY.description,
        )  # fmt: skip

    def handshake(self, result: str) -> None:
        """One handshake ended with ``result`` (one of the results given at start)."""
        self.handshakes[result] += 1

    def reloaded(self, certificate: str, took: bool) -> None:
        self.reloads[certificate, RELOAD_OK if took else RELOAD_ERROR] += 1

    def expires(self, certificate: str, when: float) -> None:
        self.expiry[certificate] = when

    def _handshakes(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.expiry.get(SERVING):  # no TLS listener: no series
            return []
        return [Observation(n, {RESULT: r}) for r, n in self.handshakes.items()]

    def _reloads(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {CERTIFICATE: c, RESULT: r})
            for (c, r), n in self.reloads.items()
            if c in self.expiry
        ]

    def _expiry(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(when, {CERTIFICATE: c}) for c, when in self.expiry.items()]
