"""How a failed request ends (``relay/failures.py``): each exception to its outcome, status and
message by the first entry of the table that matches, none shadowed by an earlier one; each
message filled from what the relay knows; anything else the relay's own bug. And an engine
that answers with something that is not HTTP, through a sidecar."""

from __future__ import annotations

import asyncio
import errno
import ssl

import aiohttp
import pytest

from llmobs.observe.timing import Outcome
from llmobs.relay.failures import (
    FAILURES,
    INTERNAL,
    ShutDown,
    connection_failed,
    failure_for,
)
from llmobs.wire.http1 import BadRequest, ProtocolError
from llmobs.wire.server import BodyTooLarge, BodyTooSlow
from tests.support.servers import SidecarFactory
from tests.support.upstreams import post, raw_upstream

QUIET = {"engine_scrape_interval": 0, "gpu_sample_interval": 0}


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


@pytest.mark.parametrize(
    ("exc", "message", "close"),
    [
        (ShutDown(), "llmobs: shutting down", True),
        (BodyTooLarge(), "request body larger than 1024 bytes", True),
        (BodyTooSlow(), "request body not received within 2.5 s", True),
        (BadRequest(431, "request head too large"), "request head too large", True),
        (TimeoutError(), "upstream timed out", False),
        (ProtocolError("garbage"), "upstream sent an invalid response: garbage", False),
        (ConnectionResetError(), "upstream unavailable: ConnectionResetError", False),
        (KeyError("a bug"), "llmobs: internal error", False),
    ],
)
def test_each_message_is_filled_from_what_the_relay_knows(
    exc: BaseException, message: str, close: bool
) -> None:
    """The client's connection closes after a refusal (its body may be unread) or a
    shutdown's 503, never after the engine's failure."""
    failure = failure_for(exc)
    filled = failure.message.format(limit=1024, timeout=2.5, error=exc, kind=type(exc).__name__)
    assert (filled, failure.close) == (message, close)


def test_only_the_engines_failures_are_its_own() -> None:
    """A warning in the log and "llmobs:" before the answer are for the engine's failures;
    a client's refused request, a shutdown or the relay's bug are not the engine's."""
    upstream = {kind for kind, failure in FAILURES if failure.upstream}
    assert upstream == {
        TimeoutError,
        ProtocolError,
        ssl.SSLCertVerificationError,
        ssl.SSLError,
        OSError,
    }
    assert not INTERNAL.upstream


async def test_garbage_from_the_engine_is_a_502(start_sidecar: SidecarFactory) -> None:
    async def garbage(writer: asyncio.StreamWriter, _: int) -> bool:
        writer.write(b"SSH-2.0-OpenSSH_9.0\r\n\r\n")
        await writer.drain()
        return False

    async with raw_upstream(garbage) as (_, url):
        side = await start_sidecar(url, **QUIET)
        async with aiohttp.ClientSession() as session:
            status, body = await post(session, side.url)
        assert status == 502
        assert b"upstream sent an invalid response" in body
        assert side.value("llmobs_requests_total", outcome="upstream_error") == 1
