"""The relay: forward any request upstream and stream the response back, byte for byte.

The only place (with the collectors) that does I/O, and the only place that reads the clock on
the data path: once per chunk, when the chunk arrives. Each chunk is written to the client
first and observed second, so telemetry can neither delay nor alter what the client receives.

Semantics, as a user of a reverse proxy expects them:
- every method and path is forwarded, the request body read whole (bounded, as nginx buffers
  it) and sent with its length, headers passed except hop-by-hop ones; ``X-Forwarded-For`` /
  ``-Proto`` added; no other header added (``upstream`` writes only ``Host`` and the length)
  and no decompression, so the engine and the client see what they would see without it;
- the response body is written to the client from the upstream socket's read callback
  (``upstream``), chunk by chunk as it comes;
- the client going away cancels the handler (the server runs with ``handler_cancellation``),
  which closes the upstream connection at once, so the engine stops generating for nobody;
- an unreachable upstream gives a JSON error (502, or 504 on timeout) in the OpenAI error
  shape; upstream HTTP errors pass through unchanged; a failure after the response has started
  closes the client connection without a clean end, as the engine itself would have;
- a client that keeps the sidecar waiting for its body longer than ``--client-timeout`` in all
  gets a JSON 408 (a slowloris body cannot hold a connection; headers: see ``app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from llmobs.config import Settings
from llmobs.formats import Route, detect_stream, route_for_path
from llmobs.formats.base import Passthrough
from llmobs.formats.inject import UsageStripper, inject_usage
from llmobs.formats.openai import OpenAIStream
from llmobs.http1 import ResponseHead
from llmobs.timing import Outcome
from llmobs.tracing import RequestMeta
from llmobs.upstream import HIGH_WATER, LOW_WATER, Connection, Upstream, UpstreamClosed

log = logging.getLogger("llmobs.proxy")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


class RequestObserver(Protocol):
    """What the relay tells observation; implemented by ``observer.Observer``."""

    def request_body(self, body: bytes) -> None: ...
    def inject(self, headers: MutableMapping[str, str]) -> None: ...
    def forwarded(self, t_ns: int) -> None: ...
    def response(self, status: int, content_type: str) -> None: ...
    def chunk(self, t_ns: int, data: bytes) -> None: ...
    def finish(self, t_ns: int, outcome: Outcome) -> object: ...


class ObserverFactory(Protocol):
    def __call__(self, route: Route, start_ns: int, meta: RequestMeta) -> RequestObserver: ...


class NullObserver:
    """Observation switched off (``--instrument false``): a bare relay, for comparison."""

    __slots__ = ()

    def request_body(self, body: bytes) -> None:
        pass

    def inject(self, headers: MutableMapping[str, str]) -> None:
        pass

    def forwarded(self, t_ns: int) -> None:
        pass

    def response(self, status: int, content_type: str) -> None:
        pass

    def chunk(self, t_ns: int, data: bytes) -> None:
        pass

    def finish(self, t_ns: int, outcome: Outcome) -> object:
        return None


NULL_OBSERVER = NullObserver()


class BodyTooLarge(Exception):
    """The request body exceeded the configured maximum while it was being forwarded."""


class BodyTooSlow(Exception):
    """The client kept the sidecar waiting for its request body longer than allowed."""


async def client_chunks(request: web.Request, budget: float) -> AsyncIterator[bytes]:
    """The request body as it arrives; ``BodyTooSlow`` once the client has kept the sidecar
    waiting ``budget`` seconds in all (a slowloris body). Only waits on the client count:
    time the upstream takes to accept what was already read does not."""
    loop = asyncio.get_running_loop()
    content = request.content
    while True:
        started = loop.time()
        try:
            async with asyncio.timeout(budget):
                chunk = await content.readany()
        except TimeoutError:
            raise BodyTooSlow from None
        if not chunk:
            return
        budget -= loop.time() - started
        yield chunk


def filter_headers(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> CIMultiDict[str]:
    """Copy ``headers`` minus hop-by-hop ones, including those named in ``Connection``."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
    }
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        lower = key.lower()
        if lower not in HOP_BY_HOP and lower not in named:
            out.add(key, value)
    return out


def upstream_headers(request: web.Request) -> CIMultiDict[str]:
    """Headers to send upstream: the client's, minus hop-by-hop and Host, plus X-Forwarded-*."""
    headers = filter_headers(request.headers)
    headers.popall("Host", None)
    headers.popall("Expect", None)  # the sidecar's server already answered 100-continue
    chain = [v for v in request.headers.getall("X-Forwarded-For", ()) if v.strip()]
    if request.remote:
        chain.append(request.remote)
    headers.popall("X-Forwarded-For", None)
    if chain:
        headers["X-Forwarded-For"] = ", ".join(chain)
    if "X-Forwarded-Proto" not in headers:
        headers["X-Forwarded-Proto"] = request.scheme
    return headers


def json_error(status: int, message: str, kind: str) -> web.Response:
    """An error the sidecar itself produced, in the OpenAI error shape."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def _read_limited(request: web.Request, limit: int, budget: float) -> bytes:
    """The whole request body, within ``limit`` bytes and ``budget`` seconds of waiting."""
    parts: list[bytes] = []
    size = 0
    async for chunk in client_chunks(request, budget):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
    return b"".join(parts)


_FRAMING = frozenset({"host", "content-length", "transfer-encoding"})


class _Stream:
    """One response body on its way from the engine to the client, per read.

    ``feed`` runs inside the upstream connection's ``data_received``: it writes the read to
    the client's transport first (framed as the client's response needs), then observes it.
    A slow client pauses upstream reads until its buffer drains.
    """

    __slots__ = ("_chunked", "_conn", "_draining", "_obs", "_stripper", "_transport", "gone")

    def __init__(
        self,
        transport: asyncio.Transport,
        chunked: bool,
        conn: Connection,
        obs: RequestObserver,
        stripper: UsageStripper | None,
    ) -> None:
        self._transport = transport
        self._chunked = chunked
        self._conn = conn
        self._obs = obs
        self._stripper = stripper
        self._draining: asyncio.Task[None] | None = None
        self.gone = False  # the client went away mid-stream

    def feed(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        transport = self._transport
        if transport.is_closing():
            if not self.gone:
                self.gone = True
                self._conn.close()  # the engine stops generating for nobody
            return
        out = self._stripper.feed(data) if self._stripper is not None else data
        if out:
            if self._chunked:
                transport.writelines((b"%x\r\n" % len(out), out, b"\r\n"))
            else:
                transport.write(out)
        self._obs.chunk(now, data)
        if transport.get_write_buffer_size() > HIGH_WATER and self._draining is None:
            self._conn.pause_reading()
            self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Resume upstream reads once the client has taken most of what is buffered."""
        transport = self._transport
        delay = 0.001
        while not transport.is_closing() and transport.get_write_buffer_size() > LOW_WATER:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        self._draining = None
        self._conn.resume_reading()

    def cancel(self) -> None:
        if self._draining is not None:
            self._draining.cancel()


class Relay:
    """The catch-all request handler, bound to the upstream, settings and an observer factory."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        new_observer: ObserverFactory | None,
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._new_observer = new_observer
        self._streams: set[Connection] = set()  # connections whose response is being relayed
        self._aborted: set[Connection] = set()  # ended by a shutdown's grace

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        clock = time.perf_counter_ns
        start = clock()
        route = route_for_path(request.path)
        obs = self._observer(route, start, request)
        settings = self._settings
        limit = settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            rejected = self._local(obs, 413, f"request body larger than {limit} bytes")
            obs.finish(clock(), Outcome.REJECTED)
            return rejected
        headers = upstream_headers(request)
        obs.inject(headers)
        stripper: UsageStripper | None = None
        outcome = Outcome.OK
        resp: web.StreamResponse | None = None
        conn: Connection | None = None
        stream: _Stream | None = None
        try:
            body: bytes | None = None
            if request.body_exists:
                body = await _read_limited(request, limit, settings.client_timeout)
                if _is_json(request.content_type) or route.dialect is not Passthrough:
                    obs.request_body(body)
                if settings.inject_usage and route.dialect is OpenAIStream:
                    rewritten = inject_usage(body)
                    if rewritten is not None:
                        body, stripper = rewritten, UsageStripper()
            elif request.method in ("POST", "PUT", "PATCH"):
                body = b""
            obs.forwarded(clock())
            fields = [(k, v) for k, v in headers.items() if k.lower() not in _FRAMING]
            raw_head = self._upstream.request_head(request.method, request.raw_path, fields, body)
            conn, head = await self._exchange(request.method, raw_head, body or b"")
            self._streams.add(conn)
            content_type = head.headers.get("Content-Type", "")
            if head.headers.get("Content-Encoding", "").lower() not in ("", "identity"):
                content_type = ""  # compressed: relayed and timed, not parsed (not malformed)
            obs.response(head.status, content_type)
            response_headers = filter_headers(head.headers)
            if stripper is not None and detect_stream(content_type) != "sse":
                stripper = None  # an error body, say: nothing to strip
            if stripper is not None:
                response_headers.popall("Content-Length", None)
            resp = web.StreamResponse(
                status=head.status, reason=head.reason, headers=response_headers
            )
            await resp.prepare(request)  # a StreamResponse sends its headers at once
            transport = request.transport
            if transport is None:
                raise ConnectionResetError("client gone")
            chunked = "chunked" in resp.headers.get("Transfer-Encoding", "").lower()
            stream = _Stream(transport, chunked, conn, obs, stripper)
            conn.relay(stream.feed)
            try:
                await conn.body_done(settings.read_timeout)
            except ConnectionError:
                if stream.gone:
                    outcome = Outcome.CLIENT_DISCONNECT
                    return resp
                raise
            if stream.gone:
                outcome = Outcome.CLIENT_DISCONNECT
                return resp
            if stripper is not None:
                await resp.write(stripper.flush())
            await resp.write_eof()
            if conn in self._aborted:
                outcome = Outcome.SHUTDOWN
            return resp
        except asyncio.CancelledError:
            outcome = Outcome.CLIENT_DISCONNECT
            raise
        except BodyTooLarge:
            outcome = Outcome.REJECTED
            return self._local(obs, 413, f"request body larger than {limit} bytes")
        except BodyTooSlow:
            outcome = Outcome.REJECTED
            return self._too_slow(obs)
        except TimeoutError:
            outcome = Outcome.UPSTREAM_TIMEOUT
            return self._upstream_failed(request, obs, resp, 504, "upstream timed out", outcome)
        except OSError as exc:
            if conn is not None and conn in self._aborted and resp is not None:
                outcome = Outcome.SHUTDOWN  # the shutdown grace ran out: end the stream cleanly
                with contextlib.suppress(ConnectionError):
                    await resp.write_eof()
                return resp
            if isinstance(exc, ConnectionError) and resp is not None and _client_gone(request):
                outcome = Outcome.CLIENT_DISCONNECT
                return resp
            outcome = Outcome.UPSTREAM_ERROR
            message = f"upstream unavailable: {type(exc).__name__}"
            return self._upstream_failed(request, obs, resp, 502, message, outcome)
        finally:
            if stream is not None:
                stream.cancel()
            if conn is not None:
                self._streams.discard(conn)
                self._aborted.discard(conn)
                if outcome is Outcome.OK:
                    self._upstream.release(conn)
                else:
                    self._upstream.discard(conn)
            obs.finish(clock(), outcome)

    async def _exchange(
        self, method: str, raw_head: bytes, body: bytes
    ) -> tuple[Connection, ResponseHead]:
        """Send the request and wait for the response head.

        A pooled connection the engine closed while it sat idle fails before any byte of a
        response; such a request is sent once more on a fresh connection (the engine never
        saw it: nginx's ``proxy_next_upstream error`` does the same).
        """
        upstream = self._upstream
        read_timeout = self._settings.read_timeout
        for attempt in (0, 1):
            conn, reused = await upstream.acquire()
            try:
                await conn.send(method, raw_head, body)
                return conn, await conn.head(read_timeout)
            except UpstreamClosed:
                upstream.discard(conn)
                if not reused or attempt:
                    raise
            except BaseException:
                upstream.discard(conn)
                raise
        raise AssertionError("unreachable")  # the second attempt returns or raises

    @property
    def active(self) -> int:
        """Responses being relayed right now."""
        return len(self._streams)

    def abort_streams(self) -> int:
        """End every stream still relayed (a shutdown's grace is over); returns how many.

        Each upstream response is closed; its handler then ends the client's response with a
        clean end (the final chunk), records the ``shutdown`` outcome and returns.
        """
        streams = list(self._streams)
        for conn in streams:
            self._aborted.add(conn)
            conn.close()
        return len(streams)

    def _observer(self, route: Route, start: int, request: web.Request) -> RequestObserver:
        """A new observer, or the null one if there is none or it cannot be made."""
        factory = self._new_observer
        if factory is None:
            return NULL_OBSERVER
        try:
            meta = RequestMeta(request.method, request.path, request.headers, time.time_ns())
            return factory(route, start, meta)
        except Exception:
            log.exception("could not start observing a request; relaying it unobserved")
            return NULL_OBSERVER

    @staticmethod
    def _local(obs: RequestObserver, status: int, message: str) -> web.Response:
        """A response the sidecar produces itself (the observer records its status)."""
        obs.response(status, "")
        kinds = {
            408: "request_timeout",
            413: "request_too_large",
            502: "upstream_error",
            504: "upstream_timeout",
        }
        return json_error(status, message, kinds[status])

    def _too_slow(self, obs: RequestObserver) -> web.Response:
        """408 for a client that sent its body too slowly; the connection is not kept."""
        timeout = self._settings.client_timeout
        resp = self._local(obs, 408, f"request body not received within {timeout:g} s")
        resp.force_close()
        return resp

    def _upstream_failed(
        self,
        request: web.Request,
        obs: RequestObserver,
        resp: web.StreamResponse | None,
        status: int,
        message: str,
        outcome: Outcome,
    ) -> web.StreamResponse:
        log.warning("%s %s: %s (%s)", request.method, request.path, message, outcome.value)
        if resp is None or not resp.prepared:
            return self._local(obs, status, f"llmobs: {message}")
        # The response has started: end it the way a broken engine would, without a clean end.
        if request.transport is not None:
            request.transport.close()
        return resp


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
