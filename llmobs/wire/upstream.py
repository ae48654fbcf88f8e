"""The upstream leg: HTTP/1.1 to the engine, pooled connections (``connection.Connection``).

What it does, as a reverse proxy's upstream leg should: one request per connection at a time,
idle connections kept for reuse (LIFO, bounded) unless the response forbids it; a connection
that went stale in the pool is never used; connect and read timeouts (the read timeout runs
between reads, checked by one timer per connection rather than one per chunk, and not while
reads are paused); the body relayed as it comes with back-pressure from a slow client (upstream
reads pause until the client's buffer drains); no header added but ``Host`` and the body's
framing.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

from llmobs.wire.connection import (
    Connection,
    Exchange,
    OnBody,
    OnHead,
    UpstreamClosed,
    UpstreamTimeout,
)
from llmobs.wire.habits import SETTLE, Habits
from llmobs.wire.http1 import Frames
from llmobs.wire.states import EngineState
from llmobs.wire.tls import EngineTls

# the connection and its exchange's types are re-exported: the relay takes them from here
__all__ = [
    "Connection", "Exchange", "OnBody", "OnHead", "Pool", "Upstream", "UpstreamClosed",
    "UpstreamTimeout",
]  # fmt: skip

_IDLE = EngineState.IDLE  # a connection's state in which the pool keeps it

# Idle connections kept for reuse. Streams of a batch end together: a pool smaller than the
# concurrency closes the surplus at once, and the next requests then open as many new
# connections in one burst (512 streams against a 256 pool: a SYN backlog overflow at the
# engine, 1 s added to TTFT at p99). An idle connection costs an fd and ~3 KiB.
MAX_IDLE = 4096


class Pool(Protocol):
    """What the relay uses of the engine's connections, whichever the protocol: HTTP/1.1's
    pool (``Upstream``) or HTTP/2's streams (``h2.client.H2Upstream``)."""

    async def acquire(self) -> tuple[Exchange, bool]: ...
    def release(self, conn: Any) -> None: ...
    def discard(self, conn: Any) -> None: ...
    def close(self) -> None: ...


class _Fixed:
    """One context, read as a watched one is (``tls.Watched``)."""

    __slots__ = ("_context",)

    def __init__(self, context: ssl.SSLContext) -> None:
        self._context = context

    def __call__(self) -> ssl.SSLContext:
        return self._context


class Upstream:
    """The engine's address and a pool of idle connections to it."""

    def __init__(
        self,
        base_url: str,
        connect_timeout: float,
        idle_timeout: float,
        tls: EngineTls | None = None,
    ) -> None:
        """``tls``: the context for an ``https`` engine at each new connection (its files may
        rotate) and the name sent (SNI) and checked in its certificate; None: the system's
        trust store and the URL's host."""
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        default = (443 if self.https else 80) == self.port and parts.port is None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self._connect_timeout = connect_timeout
        # An engine closes a connection idle for its keep-alive timeout (uvicorn, llama.cpp:
        # 5 s); one reused just then fails, and a POST may not be sent again (RFC 9110
        # 9.2.2): a pooled connection is therefore given up well before.
        self._idle_timeout = idle_timeout
        # one-chunk read lengths the connections' chunked responses have seen (http1.Frames):
        # pure, so shared by all, and bounded (256 lengths, ~60 KiB) for the whole pool
        self._frames: Frames = {}
        self._tls: Callable[[], ssl.SSLContext] | None = None
        if self.https:
            self._tls = tls.context if tls is not None else _Fixed(ssl.create_default_context())
        self._server_name = (tls.server_name if tls is not None else "") or self.host
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()
        # how the engine keeps its connections (``habits``)
        self.habits = Habits()
        # the loop its connections live on, taken at the first acquire: on CPython 3.11
        # asyncio.get_running_loop() makes a getpid system call, once a request otherwise
        self._loop: asyncio.AbstractEventLoop | None = None

    async def acquire(self) -> tuple[Connection, bool]:
        """A connection: a pooled one when there is a live one, else a new one.

        Returns it and whether it was reused (a reused one may have been closed by the
        engine an instant ago; the caller may retry such a failure once).
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        oldest = loop.time() - self._idle_timeout
        while self._idle:
            conn = self._idle.pop()  # the most recent first: the rest are older still
            if conn.idle_since < oldest:
                for stale in (conn, *self._idle):
                    stale.close()
                self._idle.clear()
                break
            if conn.streamed and self.habits.closes_after_stream is None:
                await self._settle(conn, loop)  # once: does the engine keep it after a stream?
            if (
                conn.state is _IDLE
                and conn.transport is not None
                and not conn.transport.is_closing()
            ):
                self._busy.add(conn)
                return conn, True
        try:
            async with asyncio.timeout(self._connect_timeout):
                transport, conn = await loop.create_connection(
                    lambda: Connection(loop, self._frames, self.habits),
                    self.host,
                    self.port,
                    ssl=self._tls() if self._tls is not None else None,
                    server_hostname=self._server_name if self._tls is not None else None,
                )
        except TimeoutError:
            raise UpstreamTimeout("upstream connect timed out") from None
        if conn.transport is None:  # uvloop may call connection_made after returning
            conn.attach(transport)
        self._busy.add(conn)
        return conn, False

    async def _settle(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        """Reuse the first connection to end a streamed response only once it has stayed open
        ``SETTLE`` seconds: closed meanwhile, it taught the pool the engine's habit
        (``habits``), and the request takes another; open, the engine keeps them."""
        wait = conn.idle_since + SETTLE - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if conn.state is _IDLE:
            self.habits.settled()

    def release(self, conn: Connection) -> None:
        """Back to the pool if it may carry another request, else closed."""
        self._busy.discard(conn)
        idle = self._idle
        if len(idle) >= MAX_IDLE:  # drop those the engine closed meanwhile, then check
            idle[:] = [c for c in idle if not c.closed]
        if conn.state is _IDLE and len(idle) < MAX_IDLE:  # (reusable)
            conn.resume_reading()
            conn.idle_since = conn.last_read
            idle.append(conn)
        else:
            conn.close()

    def discard(self, conn: Connection) -> None:
        """Close a connection whose exchange did not end cleanly."""
        self._busy.discard(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection, idle or in use."""
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()

    def request_head(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes | None
    ) -> bytes:
        """The request line and headers: the client's (already filtered), ``Host``, framing."""
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers]  # (a list built in one frame: no generator)
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")
