"""The ``serve`` fixture: a ProxyServer on loopback, shut down when the test ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.protocol_server import ServeFactory, serving


@pytest.fixture
async def serve() -> AsyncIterator[ServeFactory]:
    """``await serve(handler, client_timeout=..., max_body=...)``: a ProxyServer on loopback,
    shut down (and its clients closed) when the test ends."""
    async with serving() as start:
        yield start
