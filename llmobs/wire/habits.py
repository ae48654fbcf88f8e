"""What the engine has shown of how it keeps its connections, learnt by the pool.

Some engines close their connection after each streamed (chunked) response although its head
promised keep-alive: llama.cpp's llama-server answers ``Keep-Alive: timeout=5, max=100`` and
closes a few milliseconds after the last chunk. A connection back in the pool in those
milliseconds can be taken by the next request, which the engine then never reads; a POST may
not be sent again (RFC 9110 section 9.2.2), so its client would get a 502. The pool learns the
habit from the first such close and then closes a streamed response's connection at its end.

Until it knows, the first connection to end a streamed response is reused only once it has
stayed open ``SETTLE`` seconds since: the request that takes it waits for the rest of them,
once in a sidecar's life; then the engine has shown it keeps them, and nothing changes after.
"""

from __future__ import annotations

import logging

log = logging.getLogger("llmobs.upstream")

# a connection that stays open this long after its streamed response ended is kept by the
# engine (its close comes within milliseconds); one it closes within QUICK_CLOSE (well below
# any keep-alive timeout) shows the habit
SETTLE = 0.1
QUICK_CLOSE = 1.0


class Habits:
    """Whether the engine closes a connection after a streamed response (None: not known
    yet, until the first streamed response's connection is closed soon after or settles)."""

    __slots__ = ("closes_after_stream",)

    def __init__(self) -> None:
        self.closes_after_stream: bool | None = None

    def closed(self, streamed: bool, idle_s: float) -> None:
        """The engine closed a connection (idle in the pool, or taken and not yet answered)
        ``idle_s`` seconds after its last response ended; ``streamed``: that one was chunked."""
        if streamed and idle_s < QUICK_CLOSE and self.closes_after_stream is not True:
            self.closes_after_stream = True
            log.info(
                "the engine closes its connection after each streamed response, although it "
                "offers keep-alive: such a connection is closed at the response's end, not reused"
            )

    def settled(self) -> None:
        """A connection stayed open ``SETTLE`` seconds after its streamed response (a close
        seen later, within ``QUICK_CLOSE``, still teaches the habit)."""
        if self.closes_after_stream is None:
            self.closes_after_stream = False
