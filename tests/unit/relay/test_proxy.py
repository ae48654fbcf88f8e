"""The relay's pure steps: which headers pass (``relay.headers``), how a failure ends a
request (``relay.failures``), which length a relayed response keeps (``relay.response``). The
exchange itself (``relay.proxy``) runs end to end in tests/e2e/test_proxy.py and
test_faults.py."""

from __future__ import annotations

import errno

import pytest

from llmobs.observe.timing import Outcome
from llmobs.relay.failures import FAILURES, connection_failed, failure_for
from llmobs.relay.headers import HOP_BY_HOP, filter_headers
from llmobs.relay.inject import UsageStripper
from llmobs.relay.response import _length
from llmobs.wire.http1 import BadRequest, ProtocolError, parse_response_head


def test_hop_by_hop_headers_and_those_connection_names_are_dropped() -> None:
    fields = [
        ("Content-Type", "text/event-stream"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("X-Secret-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("X-Request-Id", "abc"),
        ("connection", "close, x-other"),
        ("X-Other", "2"),
    ]
    assert filter_headers(fields) == [
        ("Content-Type", "text/event-stream"),
        ("X-Request-Id", "abc"),
    ]
    # what the relay also drops is given by the caller; the order of the rest is kept
    assert filter_headers([("Host", "a"), ("B", "1"), ("A", "2")], HOP_BY_HOP | {"host"}) == [
        ("B", "1"),
        ("A", "2"),
    ]


def instances() -> dict[type[BaseException], BaseException]:
    """An instance of each kind of failure the table names."""
    made: dict[type[BaseException], BaseException] = {}
    for kind, _ in FAILURES:
        if kind is BadRequest:
            made[kind] = BadRequest(431, "header block too large")
        else:
            made[kind] = kind("x")
    return made


def test_each_failure_ends_the_request_as_its_entry_says_and_none_is_shadowed() -> None:
    made = instances()
    for i, (kind, failure) in enumerate(FAILURES):
        assert failure_for(made[kind]) is failure
        # an entry listed after a base class of it would never be reached
        assert not any(isinstance(made[kind], earlier) for earlier, _ in FAILURES[:i])


@pytest.mark.parametrize(
    ("exc", "outcome", "status"),
    [
        (TimeoutError(), Outcome.UPSTREAM_TIMEOUT, 504),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), Outcome.UPSTREAM_ERROR, 502),
        (ProtocolError("not HTTP"), Outcome.UPSTREAM_ERROR, 502),
        (BadRequest(400, "bad"), Outcome.REJECTED, 0),
        (RuntimeError("a bug of the relay's own"), Outcome.UPSTREAM_ERROR, 502),
    ],
)
def test_the_outcome_and_status_of_a_failure(
    exc: BaseException, outcome: Outcome, status: int
) -> None:
    failure = failure_for(exc)
    assert (failure.outcome, failure.status) == (outcome, status)


def test_only_a_broken_connection_counts_as_one() -> None:
    assert connection_failed(ConnectionResetError())
    assert connection_failed(ProtocolError("garbage"))
    assert not connection_failed(TimeoutError())
    assert not connection_failed(BadRequest(400, "bad"))
    assert not connection_failed(ValueError())


def test_a_rewritten_or_transfer_coded_body_drops_the_engines_length() -> None:
    plain = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 42")
    chunked = parse_response_head(
        b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\nTransfer-Encoding: chunked"
    )
    assert _length(plain, None) == 42
    assert _length(chunked, None) is None  # RFC 9112 6.3: the coding wins
    assert _length(plain, UsageStripper()) is None  # the body is rewritten
