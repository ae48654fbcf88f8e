"""The engine's response on its way to the client: the relay's per-chunk path.

Its own module because it is the hot path: ``ResponseRelay.feed`` runs once per read of
every stream, reads the clock, writes to the client first and observes second; the rest of
the exchange runs once per request (``proxy``).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns

from llmobs.observe.dialects import detect_stream
from llmobs.relay.headers import NOT_RETURNED, filter_headers
from llmobs.relay.inject import UsageStripper
from llmobs.relay.observing import RequestObserver
from llmobs.wire.http1 import ResponseHead, content_length
from llmobs.wire.server import Request
from llmobs.wire.upstream import Exchange, OnBody


class ResponseRelay:
    """One response on its way from the engine to the client, per read.

    ``on_head`` runs inside the upstream connection's ``data_received`` when the response
    head has come: it chooses the framing, writes the head to the client and returns ``feed``
    as the body's callback, so a first chunk that came with the head goes on in the same
    read, with no loop iteration in between. ``feed`` writes each read to the client first
    (framed as the client's response needs, through the request), then observes it. When both
    legs are chunked and the read was whole chunks, the read goes on as it came: one write, no
    re-framing (the request's ``write_chunks``), and a last chunk that came with the last
    token goes in the same write (``write_last``: one send fewer per request). A slow client
    pauses upstream reads until its buffer drains (the client transport's write-buffer limits
    call back, see ``server``), at no cost per chunk; a client that goes away closes the
    engine's connection (``client_gone``, called by the server), so ``feed`` never checks for
    it.
    """

    __slots__ = (
        "_obs",
        "_on_sent",
        "_relayed",
        "_request",
        "_write_chunks",
        "conn",
        "gone",
        "stripper",
    )

    def __init__(
        self,
        request: Request,
        obs: RequestObserver,
        stripper: UsageStripper | None,
        relayed: set[Exchange],
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        self._request = request
        self._write_chunks: Callable[[bytes], None] | None = None
        self._obs = obs
        self._relayed = relayed
        self.stripper = stripper
        self.conn: Exchange | None = None  # the connection whose response this is
        self.gone = False  # the client went away mid-stream
        # called once, when the request is first handed to a connection (observation starts)
        self._on_sent = on_sent

    def sent(self) -> None:
        """The request was handed to a connection: ``on_sent`` the first time, and only then
        (a retry sends it again)."""
        on_sent, self._on_sent = self._on_sent, None
        if on_sent is not None:
            on_sent()

    @property
    def unsent(self) -> bool:
        """``on_sent`` is still to be called: the request never reached a connection."""
        return self._on_sent is not None

    def observe(self, obs: RequestObserver) -> None:
        """Observe the response with ``obs`` (made once the request went upstream)."""
        self._obs = obs

    def on_head(self, conn: Exchange, head: ResponseHead) -> OnBody:
        """The response head came on ``conn``: pass it on; the body goes to ``feed``. A
        client gone before it (the handler's cancellation not yet delivered) gets nothing:
        the exchange fails at once, and no byte goes to a closed transport."""
        self.conn = conn
        self._relayed.add(conn)
        request = self._request
        if request.closed:
            self.gone = True
            raise ConnectionResetError("the client went away before the response head")
        response_headers = head.headers
        content_type = response_headers.get("Content-Type", "")
        if response_headers.get("Content-Encoding", "").lower() not in ("", "identity"):
            content_type = ""  # compressed: relayed and timed, not parsed (not malformed)
        if content_type[:16] == "application/grpc":  # its messages' encoding, for reading
            self._obs.response(head.status, content_type, response_headers.get("grpc-encoding", ""))
        else:
            self._obs.response(head.status, content_type)
        if self.stripper is not None and detect_stream(content_type) != "sse":
            self.stripper = None  # an error body, say: nothing to strip
        fields = filter_headers(head.fields, NOT_RETURNED)
        last = conn.head_ended  # HTTP/2's "trailers-only" answer, kept so
        request.begin(head.status, head.reason, fields, _length(head, self.stripper), last=last)
        if last:
            self._obs.trailers(fields)  # (gRPC's status is in it)
        self._write_chunks = request.write_chunks  # (chunked: whole chunks go on as they came)
        request.on_flow(self._hold, self._release)
        request.on_gone(self.client_gone)
        return self.feed

    def _hold(self) -> None:
        """The client's buffer is full: stop reading the engine (its tokens wait in the
        sockets), and tell observation, whose stall in the meantime is the client's."""
        conn = self.conn
        if conn is not None:
            conn.pause_reading()
        self._obs.held(perf_counter_ns())

    def _release(self) -> None:
        conn = self.conn
        if conn is not None:
            conn.resume_reading()
        self._obs.released(perf_counter_ns())

    def client_gone(self) -> None:
        """The client went away mid-stream: close the engine's connection, so that it stops
        generating for nobody and nothing more comes to ``feed`` (the handler, cancelled on
        the loop's next round, records the outcome). If the response ended in this same
        loop round, the client had all of it: the request stays ``ok`` and the connection
        goes back to the pool, as when the client leaves after its handler is done."""
        conn = self.conn
        if conn is not None and conn.relaying:
            self.gone = True
            conn.close()

    def feed(self, data: bytes, frame: bytes | None, last: bool) -> None:
        now = perf_counter_ns()
        write_chunks = self._write_chunks
        if self.stripper is not None:
            self._request.write(self.stripper.feed(data))
        elif frame is None or write_chunks is None:
            self._request.write(data)  # framed for the client
        elif last:
            self._request.write_last(frame)  # with the last chunk: the response's end
        else:
            write_chunks(frame)  # the hot path: the engine's bytes, as they came
        self._obs.chunk(now, data)


def _length(head: ResponseHead, stripper: UsageStripper | None) -> int | None:
    """The response's Content-Length to pass on: the engine's, unless the body is rewritten
    or framed by a transfer coding, which overrides it (RFC 9112 section 6.3: the body read
    is not that length, and a client counting on it would read the next response into it)."""
    if stripper is not None or "Transfer-Encoding" in head.headers:
        return None
    return content_length(head.headers)
