"""The relay: forward any request upstream and stream the response back, byte for byte.

The only place (with the collectors) that does I/O, and the only place that reads the clock on
the data path: once per chunk, when the chunk arrives. Each chunk is written to the client
first and observed second, so telemetry can neither delay nor alter what the client receives.

Semantics, as a user of a reverse proxy expects them:
- every method and path is forwarded, the body streamed as it arrives, headers passed except
  hop-by-hop ones; ``X-Forwarded-For`` / ``-Proto`` added; no header the client did not send
  (the HTTP client's automatic ``Accept-Encoding`` etc. are suppressed) and no decompression,
  so the engine and the client see what they would see without the sidecar;
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

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llmobs.config import Settings
from llmobs.formats import Route, detect_stream, route_for_path
from llmobs.formats.base import Passthrough
from llmobs.formats.inject import UsageStripper, inject_usage
from llmobs.formats.openai import OpenAIStream
from llmobs.timing import Outcome
from llmobs.tracing import RequestMeta

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
_NO_AUTO_HEADERS = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})


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


def filter_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
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


class RequestBody:
    """Streams the request body upstream, enforcing the size limit; keeps JSON for observation.

    The HTTP client wraps exceptions raised inside a body iterator, so exceeding the limit is
    also recorded in ``too_large`` (``too_slow``) for the handler to recognise.
    """

    __slots__ = ("_keep", "_limit", "_obs", "_request", "_timeout", "too_large", "too_slow")

    def __init__(
        self, request: web.Request, obs: RequestObserver, limit: int, keep: bool, timeout: float
    ) -> None:
        self._request = request
        self._obs = obs
        self._limit = limit
        self._keep = keep  # JSON, or a known LLM path (curl -d sends no JSON content type)
        self._timeout = timeout
        self.too_large = False
        self.too_slow = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        request = self._request
        keep: list[bytes] | None = [] if self._keep else None
        size = 0
        try:
            async for chunk in client_chunks(request, self._timeout):
                size += len(chunk)
                if size > self._limit:
                    self.too_large = True
                    raise BodyTooLarge
                if keep is not None:
                    keep.append(chunk)
                yield chunk
        except BodyTooSlow:
            self.too_slow = True
            raise
        if keep is not None:
            self._obs.request_body(b"".join(keep))
        self._obs.forwarded(time.perf_counter_ns())


async def _read_limited(request: web.Request, limit: int, budget: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in client_chunks(request, budget):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
    return b"".join(parts)


class Relay:
    """The catch-all request handler, bound to a session, settings and an observer factory."""

    def __init__(
        self,
        settings: Settings,
        session: aiohttp.ClientSession,
        new_observer: ObserverFactory | None,
    ) -> None:
        self._settings = settings
        self._session = session
        self._new_observer = new_observer
        self._base = settings.upstream_base
        self._streams: set[aiohttp.ClientResponse] = set()  # responses being relayed now
        self._aborted: set[aiohttp.ClientResponse] = set()  # ended by a shutdown's grace
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.connect_timeout, sock_read=settings.read_timeout
        )

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        clock = time.perf_counter_ns
        start = clock()
        route = route_for_path(request.path)
        obs = self._observer(route, start, request)
        limit = self._settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            rejected = self._local(obs, 413, f"request body larger than {limit} bytes")
            obs.finish(clock(), Outcome.REJECTED)
            return rejected
        body = None
        if request.body_exists:
            keep = _is_json(request.content_type) or route.dialect is not Passthrough
            body = RequestBody(request, obs, limit, keep, self._settings.client_timeout)
        headers = upstream_headers(request)
        obs.inject(headers)
        data: AsyncIterator[bytes] | bytes | None = body.__aiter__() if body else None
        stripper: UsageStripper | None = None
        outcome = Outcome.OK
        resp: web.StreamResponse | None = None
        relayed: aiohttp.ClientResponse | None = None
        try:
            if body is not None and self._settings.inject_usage and route.dialect is OpenAIStream:
                budget = self._settings.client_timeout
                data, stripper = await self._inject(request, obs, headers, limit, budget)
            elif body is None:
                obs.forwarded(clock())
            async with self._session.request(
                request.method,
                URL(self._base + request.raw_path, encoded=True),
                headers=headers,
                data=data,
                allow_redirects=False,
                skip_auto_headers=_NO_AUTO_HEADERS,
                timeout=self._timeout,
            ) as upstream:
                relayed = upstream
                self._streams.add(upstream)
                content_type = upstream.headers.get("Content-Type", "")
                if upstream.headers.get("Content-Encoding", "").lower() not in ("", "identity"):
                    content_type = ""  # compressed: relayed and timed, not parsed (not malformed)
                obs.response(upstream.status, content_type)
                response_headers = filter_headers(upstream.headers)
                if stripper is not None and detect_stream(content_type) != "sse":
                    stripper = None  # an error body, say: nothing to strip
                if stripper is not None:
                    response_headers.popall("Content-Length", None)
                resp = web.StreamResponse(
                    status=upstream.status, reason=upstream.reason, headers=response_headers
                )
                await resp.prepare(request)
                async for chunk in upstream.content.iter_any():
                    now = clock()
                    try:
                        await resp.write(stripper.feed(chunk) if stripper else chunk)
                    except ConnectionError:
                        outcome = Outcome.CLIENT_DISCONNECT
                        upstream.close()
                        break
                    obs.chunk(now, chunk)
                else:
                    if stripper is not None:
                        await resp.write(stripper.flush())
                    await resp.write_eof()
                    if upstream in self._aborted:
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
        except (aiohttp.ClientError, OSError) as exc:
            if relayed is not None and relayed in self._aborted and resp is not None:
                outcome = Outcome.SHUTDOWN  # the shutdown grace ran out: end the stream cleanly
                with contextlib.suppress(ConnectionError):
                    await resp.write_eof()
                return resp
            if body is not None and body.too_large:
                outcome = Outcome.REJECTED
                return self._local(obs, 413, f"request body larger than {limit} bytes")
            if body is not None and body.too_slow:
                outcome = Outcome.REJECTED
                return self._too_slow(obs)
            if isinstance(exc, ConnectionError) and resp is not None and _client_gone(request):
                outcome = Outcome.CLIENT_DISCONNECT
                return resp
            outcome = Outcome.UPSTREAM_ERROR
            message = f"upstream unavailable: {type(exc).__name__}"
            return self._upstream_failed(request, obs, resp, 502, message, outcome)
        finally:
            if relayed is not None:
                self._streams.discard(relayed)
                self._aborted.discard(relayed)
            obs.finish(clock(), outcome)

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
        for upstream in streams:
            self._aborted.add(upstream)
            upstream.close()
        return len(streams)

    @staticmethod
    async def _inject(
        request: web.Request,
        obs: RequestObserver,
        headers: CIMultiDict[str],
        limit: int,
        budget: float,
    ) -> tuple[bytes, UsageStripper | None]:
        """``--inject-usage``: the body, rewritten to ask for usage when it did not."""
        raw = await _read_limited(request, limit, budget)
        obs.request_body(raw)
        obs.forwarded(time.perf_counter_ns())
        rewritten = inject_usage(raw)
        if rewritten is None:
            return raw, None
        headers.popall("Content-Length", None)
        return rewritten, UsageStripper()

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
