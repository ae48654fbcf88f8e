"""The relay: forward any request upstream and stream the response back, byte for byte.

The only place that reads the clock on the data path: once per chunk, when the chunk arrives
(the sockets are ``server``'s and ``upstream``'s). Each chunk is written to the client first
and observed second, so telemetry can neither delay nor alter what the client receives. Each
request is an ``_Exchange`` in small steps; its response goes back through a
``response.ResponseRelay``; how a failure ends one is a table (``failures.FAILURES``).

Semantics, as a user of a reverse proxy expects them:
- every method and path is forwarded, the request body read whole (bounded, as nginx buffers
  it) and sent with its length, headers passed except hop-by-hop ones; ``X-Forwarded-For`` /
  ``-Proto`` added; no other header added (``upstream`` writes only ``Host`` and the length)
  and no decompression, so the engine and the client see what they would see without it
  (``headers``);
- the response body is written to the client from the upstream socket's read callback
  (``upstream``), chunk by chunk as it comes;
- the client going away closes the upstream connection at once (``server.Request.on_gone``,
  then the handler's cancellation), so the engine stops generating for nobody;
- an unreachable upstream gives a JSON error (502, or 504 on timeout) in the OpenAI error
  shape; upstream HTTP errors pass through unchanged; a failure after the response has started
  closes the client connection without a clean end, as the engine itself would have;
- a client that keeps the sidecar waiting for its body longer than ``--client-timeout`` in all
  gets a JSON 408 (a slowloris body cannot hold a connection; headers: see ``server``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from time import perf_counter_ns
from urllib.parse import urlsplit

from llmobs.config.logs import method_label
from llmobs.config.settings import Settings
from llmobs.observe.dialects import Route, route_for_request
from llmobs.observe.dialects.base import Passthrough
from llmobs.observe.dialects.errors import error_body
from llmobs.observe.dialects.openai import OpenAIStream
from llmobs.observe.timing import Outcome
from llmobs.relay.deferred import Deferred
from llmobs.relay.failures import INTERNAL, ShutDown, connection_failed, failure_for
from llmobs.relay.grpc import first_message, grpc_error, grpc_status, is_grpc
from llmobs.relay.headers import upstream_headers, with_trace
from llmobs.relay.inject import UsageStripper, inject_usage
from llmobs.relay.observing import NULL_OBSERVER, ObserverFactory, RequestObserver
from llmobs.relay.response import ResponseRelay
from llmobs.relay.upgrade import (
    Handshake,
    Limits,
    SessionSink,
    WebSocketSession,
    is_websocket,
    upgrade_headers,
)
from llmobs.wire.connection import Tail
from llmobs.wire.server import Request
from llmobs.wire.upstream import Connection, Exchange, Pool, Upstream, UpstreamClosed

log = logging.getLogger("llmobs.proxy")

_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})  # RFC 9110 9.2.2


class Relay:
    """The request handler, bound to the upstream, settings and an observer factory: each
    request is an ``_Exchange``; the relay keeps what they share (the pool, the connections
    a shutdown must end, the deferred bookkeeping)."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        new_observer: ObserverFactory | None,
        sessions: SessionSink | None = None,
        pool: Pool | None = None,
        grpc_pool: Pool | None = None,
    ) -> None:
        """``sessions``: where WebSocket sessions are told (None: relayed, not observed);
        ``pool``: the engine's connections requests go on (HTTP/2's, ``--upstream-http2``),
        else ``upstream``, HTTP/1.1's, which WebSocket upgrades take either way;
        ``grpc_pool``: HTTP/2's, which gRPC requests take whatever ``pool`` is."""
        self.settings = settings
        self.upstream = upstream
        self.pool: Pool = pool if pool is not None else upstream
        self.grpc_pool: Pool = grpc_pool if grpc_pool is not None else self.pool
        self.websocket = settings.websocket  # upgrades relayed (else refused by the engine)
        self.sessions = sessions
        self.limits = Limits(
            settings.websocket_max_message_bytes, settings.websocket_idle_timeout,
            settings.client_timeout,
        )  # fmt: skip
        # where the engine is, for the log (never the client's answer): no userinfo in it
        parts = urlsplit(settings.upstream)
        self.where = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        self.new_observer = new_observer
        self.streams: set[Exchange] = set()  # exchanges whose response is being relayed
        self.aborted: set[Exchange] = set()  # ended by a shutdown's grace
        # sent, until their exchange ends (the head awaited, then the body relayed): a
        # shutdown's grace ends them; ``streams`` is those whose head came (``active``)
        self._pending: set[Exchange] = set()
        self._ending = False  # a shutdown's grace is over: nothing more goes upstream
        self._deferred = Deferred()  # each request's bookkeeping, once the pending I/O is served

    def __call__(self, request: Request) -> Coroutine[None, None, None]:
        # the exchange's own coroutine, not one more awaiting it: a frame fewer per request
        return _Exchange(self, request).run()

    async def send(
        self,
        method: str,
        raw_head: bytes,
        body: bytes,
        stream: ResponseRelay,
        pool: Pool,
        tail: Tail | None = None,
    ) -> None:
        """Send the request and relay its response through ``stream``, to its end.

        A pooled connection the engine closed while it sat idle fails before any byte of a
        response. An idempotent request is then sent once more on a fresh connection; others
        (a POST to a completions route) are not: the engine may have read one and failed on
        it, and a proxy must not repeat it (RFC 9110 section 9.2.2; nginx's default too). The
        pool's idle timeout keeps that race rare. Until a head has come the connection is
        this method's to discard; after, the exchange's (``stream.conn``). A ``tail`` (the
        rest of a gRPC stream's body, still coming) goes on the HTTP/2 exchange as it comes.
        """
        for attempt in (0, 1):
            conn, reused = await pool.acquire()
            if self._ending:  # the grace ran out while it connected (or before it was sent)
                pool.discard(conn)
                raise ShutDown()
            self._pending.add(conn)
            try:
                if tail is None:
                    conn.send(method, raw_head, body, stream.on_head)
                else:  # (HTTP/2's exchange: ``grpc_pool``'s)
                    conn.send(method, raw_head, body, stream.on_head, tail)  # type: ignore[call-arg]
                stream.sent()  # the first time: observation starts
                await conn.wait(self.settings.read_timeout)
                return
            except UpstreamClosed:
                if stream.conn is not None:
                    raise
                pool.discard(conn)
                if conn in self.aborted:  # no head by the end of a shutdown's grace
                    self.aborted.discard(conn)
                    raise ShutDown() from None
                retry = method in _IDEMPOTENT and tail is None
                if not reused or attempt or not conn.unanswered or not retry:
                    raise
            except BaseException:
                if stream.conn is None:
                    pool.discard(conn)
                raise
            finally:
                self._pending.discard(conn)
        raise AssertionError("unreachable")  # the second attempt returns or raises

    def record(self, obs: RequestObserver, t_ns: int, outcome: Outcome) -> None:
        """Record the request's end (stamped now) once the loop has served the sockets that
        are ready: new requests go upstream before the bookkeeping of finished ones."""
        if obs is not NULL_OBSERVER:
            self._deferred.call(obs.finish, t_ns, outcome)

    def flush(self) -> None:
        """Record every finished request now (shutdown, tests)."""
        self._deferred.drain()

    @property
    def active(self) -> int:
        """Responses being relayed right now."""
        return len(self.streams)

    def abort_streams(self) -> int:
        """End every exchange still under way (a shutdown's grace is over); returns how many.

        Each upstream connection is closed. A handler whose response has started ends it with
        a clean end (the final chunk); one still waiting for its response head (a request
        queued in the engine, or not streamed) answers 503 and closes. Either records the
        ``shutdown`` outcome and returns.
        """
        self._ending = True
        streams = self.streams | self._pending
        for conn in streams:
            self.aborted.add(conn)
            conn.close()
        return len(streams)

    def observer(self, route: Route, start: int, request: Request) -> RequestObserver:
        """A new observer, or the null one if there is none or it cannot be made."""
        factory = self.new_observer
        if factory is None:
            return NULL_OBSERVER
        try:
            return factory(route, start, request)
        except Exception:
            log.exception("could not start observing a request; relaying it unobserved")
            return NULL_OBSERVER


class _Exchange:
    """One request through the relay, in steps: refused at once if its declared length is
    over the limit (``_refuse_too_large``); the body read; ``_prepare`` (the upstream request
    made); ``relay.send`` (sent, and its response relayed by a ``ResponseRelay``); ``_end``.
    A failure anywhere ends it as ``failures.FAILURES`` says (``_failed``), and ``_finish``
    records exactly one outcome."""

    __slots__ = (
        "_obs", "grpc", "observed", "outcome", "relay", "request", "route", "start", "stream",
        "switched", "upgrade",
    )  # fmt: skip

    def __init__(self, relay: Relay, request: Request) -> None:
        self.relay = relay
        self.request = request
        self.start = perf_counter_ns()
        self.route = route_for_request(request.method, request.path)
        self.outcome = Outcome.OK
        self.stream: ResponseRelay | None = None
        self.observed: bytes | None = None  # the body, for the observer to parse
        # Observation starts once the request is on its way upstream (``_observe``), so that
        # the engine does not wait for it: the usual request, whose body came with its head.
        # The observer is made first when it adds a trace context to the request, or when the
        # body is still on its way (the request is in flight, and counted as active, while it
        # uploads); a request that never goes upstream gets one at its end.
        self._obs: RequestObserver | None = None
        # a WebSocket's handshake (``upgrade``): observed only if the engine refuses it; a
        # session once it switched (``switched``)
        self.upgrade = request.method == "GET" and relay.websocket and is_websocket(request)
        self.switched = False
        # gRPC: HTTP/2's alone (an HTTP/1.1 client saying so is relayed as any other)
        self.grpc = request.head.version >= (2, 0) and is_grpc(
            request.headers.get("Content-Type", "")
        )
        factory = relay.new_observer
        if (
            factory is not None
            and not self.upgrade
            and (factory.traces or not request.body_complete)
        ):
            self._obs = relay.observer(self.route, self.start, request)

    def _observer(self) -> RequestObserver:
        if self._obs is None:
            self._obs = self.relay.observer(self.route, self.start, self.request)
        return self._obs

    async def run(self) -> None:
        try:
            request = self.request
            length = request.content_length
            if length is not None and length > self.relay.settings.max_body_bytes:
                self._refuse_too_large()  # before a byte of the body is read
                return
            body: bytes | None = None
            tail: Tail | None = None
            budget = self.relay.settings.client_timeout
            if request.has_body and self.grpc:  # its first message; the rest as it comes
                body = await request.read_start(budget, first_message)
                tail = None if request.body_complete else request
            elif request.has_body:  # read whole (bounded, within the client timeout)
                body = await request.read_body(budget)
            method, raw_head, body, stream = self._prepare(body, tail is not None)
            try:
                relay = self.relay  # its pool: an upgrade's HTTP/1.1, gRPC's HTTP/2, the rest's
                pool = (
                    relay.upstream if self.upgrade else relay.grpc_pool if self.grpc else relay.pool
                )
                await relay.send(method, raw_head, body, stream, pool, tail)
            except ConnectionError:
                if not stream.gone:
                    raise
            if isinstance(stream, Handshake) and stream.head is not None:
                await self._session(stream)
                return
            self._end(stream)
        except asyncio.CancelledError:
            self.outcome = Outcome.CLIENT_DISCONNECT
            raise
        except Exception as exc:
            self._failed(exc)
        finally:
            self._finish()

    async def _session(self, handshake: Handshake) -> None:
        """The engine switched to a WebSocket: relay the session to its end."""
        conn = handshake.conn
        assert handshake.head is not None and isinstance(conn, Connection)
        self.switched = True
        relay = self.relay
        session = WebSocketSession(self.request, handshake.head, conn, relay.sessions)
        await session.run(relay.limits)

    def _refused(self) -> RequestObserver:
        """The engine answered an upgrade with no 101: a request, observed from now."""
        self._observe()
        assert self._obs is not None
        return self._obs

    def _refuse_too_large(self) -> None:
        """A body declared larger than the limit: 413, and the connection closed."""
        self.outcome = Outcome.REJECTED
        limit = self.relay.settings.max_body_bytes
        self._answer(413, f"request body larger than {limit} bytes", close=True)

    def _prepare(
        self, body: bytes | None, streamed: bool = False
    ) -> tuple[str, bytes, bytes, ResponseRelay]:
        """The request as it goes upstream, with its ``body`` (read; None: it has none; its
        start when ``streamed``, a gRPC stream's, whose length is then unknown) and
        ``--inject-usage`` applied: method, head, body, and the stream its response will
        take."""
        request, relay = self.request, self.relay
        headers = upstream_headers(request, self.grpc)
        if self.upgrade:
            headers += upgrade_headers(request)
        elif self._obs is not None:
            headers = with_trace(self._obs, headers)
        stripper: UsageStripper | None = None
        if body is not None:
            if relay.new_observer is not None:
                self.observed = _observable(self.route, request, body)
                if relay.settings.inject_usage and self.route.dialect is OpenAIStream:
                    body, stripper = self._inject_usage(body)
        elif request.method in ("POST", "PUT", "PATCH"):
            body = b""
        raw_head = relay.upstream.request_head(
            request.method, request.target, headers, None if streamed else body
        )
        on_sent = self._observe if relay.new_observer is not None else None
        if self.upgrade:
            stream: ResponseRelay = Handshake(request, relay.streams, self._refused)
        else:
            stream = ResponseRelay(request, NULL_OBSERVER, stripper, relay.streams, on_sent)
        self.stream = stream
        return request.method, raw_head, body or b"", stream

    def _inject_usage(self, body: bytes) -> tuple[bytes, UsageStripper | None]:
        """``--inject-usage``: the body asks the engine for usage, which the client then does
        not see (``UsageStripper``); a failure of the rewrite leaves the body as it came."""
        try:
            rewritten = inject_usage(body)
        except Exception:  # a bug of the rewrite's
            log.exception("%s %s: --inject-usage failed", _method(self.request), self.route)
            rewritten = None
        return (body, None) if rewritten is None else (rewritten, UsageStripper())

    def _observe(self) -> None:
        """The request went upstream: observation starts (the stream's ``sent``)."""
        t_ns = perf_counter_ns()
        obs = self._obs or self._observer()
        if self.observed is not None:
            obs.request_body(self.observed)
            self.observed = None
        obs.forwarded(t_ns)
        assert self.stream is not None
        self.stream.observe(obs)

    def _end(self, stream: ResponseRelay) -> None:
        """The response came to its end (or the client went away during it); the engine's
        trailers (gRPC's status), if it sent some, end it as they came."""
        if stream.gone:
            self.outcome = Outcome.CLIENT_DISCONNECT
            return
        self._flush(stream)
        conn = stream.conn
        trailers = conn.trailers if conn is not None else None
        self.request.end(trailers)
        if trailers:  # (HTTP/2's: gRPC's status), observed once the client has them
            self._observer().trailers(trailers)
        if stream.conn in self.relay.aborted:
            self.outcome = Outcome.SHUTDOWN

    def _flush(self, stream: ResponseRelay | None) -> None:
        """What ``--inject-usage``'s stripper still holds goes to the client, however the
        response ends: a finish chunk it held, an event cut short (the client would have had
        its bytes without the sidecar)."""
        if stream is not None and stream.stripper is not None:
            held = stream.stripper.flush()
            if held:
                self.request.write(held)

    def _failed(self, exc: Exception) -> None:
        """The exchange failed: one outcome, and the client told what it can be told."""
        request = self.request
        conn = self.stream.conn if self.stream is not None else None
        if connection_failed(exc) and request.started:
            if conn is not None and conn in self.relay.aborted:
                self.outcome = Outcome.SHUTDOWN  # the shutdown grace ran out: a clean end
                self._flush(self.stream)  # (a gRPC call's: UNAVAILABLE, which it may retry)
                request.end(grpc_status(503, "llmobs: shutting down") if self.grpc else None)
                return
            if isinstance(exc, ConnectionError) and _client_gone(request):
                self.outcome = Outcome.CLIENT_DISCONNECT
                return
        failure = failure_for(exc)
        self.outcome = failure.outcome
        settings = self.relay.settings
        message = failure.message.format(
            limit=settings.max_body_bytes, timeout=settings.client_timeout, error=exc,
            kind=type(exc).__name__,
        )  # fmt: skip
        if failure is INTERNAL:
            log.exception("%s %s: the relay failed", _method(request), self.route)
        elif failure.upstream:  # named by method and route, never by path: a client chose it
            outcome = failure.outcome.value
            log.warning(
                "%s %s: %s (%s; upstream %s)", _method(request), self.route, message, outcome,
                self.relay.where,
            )  # fmt: skip
            message = f"llmobs: {message}"
        if request.started:  # end it the way a broken engine would, uncleanly
            self._flush(self.stream)
            request.abort()
        else:
            status = failure.status or getattr(exc, "status", 400)
            self._answer(status, message, close=failure.close)

    def _answer(self, status: int, message: str, close: bool = False) -> None:
        """A response the sidecar produces itself (the observer records its status); to a
        gRPC client, a gRPC status ("trailers-only"), which its library can read."""
        obs = self._observer()
        obs.response(status, "")
        if self.grpc:
            fields = grpc_error(status, message)
            self.request.begin(200, "OK", fields, None, last=True)
            obs.trailers(fields)
            return
        body = error_body(self.route.name, status, message)  # in the API's own shape
        self.request.respond_error(status, message, close=close, body=body)

    def _finish(self) -> None:
        """Exactly one outcome: the connection back to the pool or closed, and the record."""
        request, relay = self.request, self.relay
        request.on_flow(None, None)
        request.on_gone(None)
        stream = self.stream
        conn = stream.conn if stream is not None else None
        if self.switched:  # a WebSocket session: its own record (``upgrade``), no request's
            if conn is not None:
                tunnels: Pool = relay.upstream  # (an upgrade's: HTTP/1.1's)
                tunnels.discard(conn)
            return
        if conn is not None:
            relay.streams.discard(conn)
            relay.aborted.discard(conn)
            pool: Pool = (
                relay.upstream if self.upgrade else relay.grpc_pool if self.grpc else relay.pool
            )
            if self.outcome is Outcome.OK:
                pool.release(conn)
            else:
                pool.discard(conn)
        if self.observed is not None and stream is not None and stream.unsent:
            # never sent (no connection to the engine, say): the body is read now, so the
            # failure is counted under its model, as every other outcome is
            self._observer().request_body(self.observed)
        relay.record(self._obs or self._observer(), perf_counter_ns(), self.outcome)


def _observable(route: Route, request: Request, body: bytes) -> bytes | None:
    """The body, if the observer can read anything of it (an API route's, or JSON)."""
    if route.dialect is not Passthrough or _is_json(request.headers.get("Content-Type", "")):
        return body
    return None


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _method(request: Request) -> str:
    return method_label(request.method)


def _client_gone(request: Request) -> bool:
    return request.closed
