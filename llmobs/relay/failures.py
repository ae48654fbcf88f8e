"""How a failed request ends: an exception -> its outcome, status and message, as a table.

One table (``FAILURES``) rather than a branch per exception in the exchange, so that each
failure's answer is read, changed and tested in one place (tests/unit/relay/test_failures.py
checks that no entry is shadowed by an earlier one).
"""

from __future__ import annotations

import ssl
from typing import NamedTuple

from llmobs.observe.timing import Outcome
from llmobs.wire.http1 import BadRequest, ProtocolError
from llmobs.wire.server import BodyTooLarge, BodyTooSlow


class ShutDown(Exception):
    """A request still waiting for its response head when a shutdown's grace ran out."""


class _Failure(NamedTuple):
    """What a request that failed this way ends in."""

    outcome: Outcome
    status: int  # the sidecar's answer if the response has not begun (0: the error's own)
    message: str  # its text: {limit}, {timeout}, {error} and {kind} are filled in
    upstream: bool  # the engine's failure: a warning in the log (the answer says "llmobs:")
    close: bool  # the client's connection is closed after the answer (its body unread)


# An exception -> the request's end, the first entry that matches (BadRequest is a
# ProtocolError, and both, TimeoutError and the TLS errors are OSErrors: they come first).
FAILURES: tuple[tuple[type[BaseException], _Failure], ...] = (
    (ShutDown, _Failure(Outcome.SHUTDOWN, 503, "llmobs: shutting down", False, True)),
    (BodyTooLarge, _Failure(
        Outcome.REJECTED, 413, "request body larger than {limit} bytes", False, True
    )),
    (BodyTooSlow, _Failure(
        Outcome.REJECTED, 408, "request body not received within {timeout:g} s", False, True
    )),
    (BadRequest, _Failure(Outcome.REJECTED, 0, "{error}", False, True)),
    (TimeoutError, _Failure(Outcome.UPSTREAM_TIMEOUT, 504, "upstream timed out", True, False)),
    (ProtocolError, _Failure(
        Outcome.UPSTREAM_ERROR, 502, "upstream sent an invalid response: {error}", True, False
    )),
    (ssl.SSLCertVerificationError, _Failure(
        Outcome.UPSTREAM_ERROR, 502, "upstream's TLS certificate not accepted", True, False
    )),
    (ssl.SSLError, _Failure(
        Outcome.UPSTREAM_ERROR, 502, "no TLS connection to the upstream: {kind}", True, False
    )),
    (OSError, _Failure(Outcome.UPSTREAM_ERROR, 502, "upstream unavailable: {kind}", True, False)),
)  # fmt: skip
INTERNAL = _Failure(Outcome.UPSTREAM_ERROR, 502, "llmobs: internal error", False, False)


def failure_for(exc: BaseException) -> _Failure:
    """How a request that raised ``exc`` ends (``FAILURES``; anything else is the relay's
    own bug: a 502, or a cut response)."""
    for kind, failure in FAILURES:
        if isinstance(exc, kind):
            return failure
    return INTERNAL


def connection_failed(exc: Exception) -> bool:
    """A connection broke (either leg's): not a timeout, not a refused request."""
    return isinstance(exc, OSError) and not isinstance(exc, TimeoutError | BadRequest)
