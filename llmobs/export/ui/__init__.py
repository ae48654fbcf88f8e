"""The live page on the admin port: ``/ui``, its data (``/ui/data``), its files (``/ui/static``).

A ticker reads the sidecar's own totals once a second into a ``live.LiveRing`` (nothing per
chunk or per request); the page polls ``/ui/data?since=<its last point>`` once a second and
draws the columns with uPlot, vendored from npm (``static/``, with its licence: 53 KB). No
CDN, no network: a laptop with no Prometheus or Grafana sees the stutter and the queue.
Protected like /metrics (``--metrics-token``): a browser asks for it (HTTP Basic, the token as
the password), a script may send it as a bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from llmobs.export.live import GaugeSource, LiveRing, Totals
from llmobs.export.metrics.catalogue import ITL, TTFT
from llmobs.export.metrics.sink import MetricsSink
from llmobs.export.ui.totals import live_totals

log = logging.getLogger(__name__)
# A poll for this many points or fewer is answered on the event loop; more (a page opened on a
# full ring) in a worker thread, so a render never holds the relay's loop (docs/benchmarks.md)
INLINE_POINTS = 10
STATIC = Path(__file__).parent / "static"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
# Scripts and styles from this origin only; uPlot sets style attributes on what it draws.
_SECURITY = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _json_encoder() -> Callable[[Any], bytes]:
    """orjson where it is installed (a default dependency on CPython): a full ring's JSON in a
    third of json's time (docs/benchmarks.md, "The live page")."""
    try:
        import orjson  # noqa: PLC0415 - optional dependency
    except ImportError:  # pragma: no cover - depends on the environment
        return lambda obj: json.dumps(obj).encode()
    encode: Callable[[Any], bytes] = orjson.dumps
    return encode


_dumps = _json_encoder()


@dataclass(frozen=True)
class _File:
    body: bytes
    content_type: str
    etag: str


def _files() -> dict[str, _File]:
    """Every file the page uses, read once (the page is ~60 KB), by name."""
    out = {}
    for path in sorted(STATIC.iterdir()):
        content_type = _TYPES.get(path.suffix)
        if content_type is not None:
            body = path.read_bytes()
            out[path.name] = _File(body, content_type, f'"{hashlib.sha256(body).hexdigest()[:16]}"')
    return out


class LivePage:
    """The ring the page shows and the ticker that fills it, a point a second. The
    collectors' gauges come through ``gauges`` (the assembly passes theirs): export never
    imports the collectors."""

    def __init__(
        self,
        sink: MetricsSink,
        gauges: GaugeSource | None = None,
        seconds: int = 600,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.gauges = gauges
        self.clock = clock
        # the bounds the sink's TTFT and ITL histograms have (the operator's, if set), and
        # the currency its costs are in
        self.ring = LiveRing(sink.define(TTFT).buckets, sink.define(ITL).buckets, seconds,
                             sink.mapping.currency)  # fmt: skip
        self.files = _files()
        self.rendering = asyncio.Lock()

    def tick(self) -> None:
        """Read the totals now into the ring."""
        models, queue, active = live_totals(self.sink)
        gauges = self.gauges() if self.gauges is not None else {}
        self.ring.add(self.clock(), Totals(models, queue, active, gauges))

    async def _run(self) -> None:
        """A tick a second on the loop's monotonic clock, from the next whole second of the
        wall clock on: points a second apart whatever a tick costs or the wall clock does; a
        loop that fell behind skips the seconds it missed rather than ticking in a burst."""
        loop = asyncio.get_running_loop()
        next_at = loop.time() + (1.0 - self.clock() % 1.0)
        while True:
            await asyncio.sleep(max(next_at - loop.time(), 0.0))
            next_at = max(next_at + 1.0, loop.time() + 0.5)
            try:
                self.tick()
            except Exception:  # the page loses a point; the sidecar goes on
                log.exception("live page: a tick failed")

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: tick while the admin application runs."""
        task = asyncio.ensure_future(self._run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def data(self, since: float) -> bytes:
        """The points after ``since`` as the page's JSON: a poll's few on the event loop, a
        full ring's (a page opened) in a worker thread, one at a time (a reload storm queues,
        it does not pile up)."""
        ring = self.ring
        if ring.count_since(since) <= INLINE_POINTS:
            return _dumps(ring.data(since))
        async with self.rendering:
            return await asyncio.to_thread(lambda: _dumps(ring.data(since)))


def refused() -> web.Response:
    """What a request without the token gets: a browser asks for it (HTTP Basic)."""
    return web.json_response(
        {"error": "the live page needs the metrics token"},
        status=401,
        headers={"WWW-Authenticate": 'Basic realm="llmobs", charset="UTF-8"', **_SECURITY},
    )


def send(request: web.Request, found: _File, cache: str) -> web.Response:
    """A file of the page, or 304 where the browser has this version (its ETag)."""
    headers = {"Cache-Control": cache, "ETag": found.etag, **_SECURITY}
    if request.headers.get("If-None-Match") == found.etag:
        return web.Response(status=304, headers=headers)
    return web.Response(body=found.body, headers={"Content-Type": found.content_type, **headers})


def parse_since(query: Mapping[str, str]) -> float | None:
    """The ``since`` a poll asks from (unix seconds; 0, every point, when absent); None
    where it is not a number."""
    try:
        return float(query.get("since", "0"))
    except ValueError:
        return None


class _Routes:
    """The page's handlers, each refusing a request without the token first."""

    def __init__(self, page: LivePage, allowed: Callable[[web.Request], bool]) -> None:
        self.page = page
        self.allowed = allowed

    async def root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    async def index(self, request: web.Request) -> web.Response:
        if not self.allowed(request):
            return refused()
        if request.path == "/ui":  # relative links need the slash
            raise web.HTTPFound("/ui/")
        return send(request, self.page.files["index.html"], "no-cache")

    async def static(self, request: web.Request) -> web.Response:
        if not self.allowed(request):
            return refused()
        name = request.match_info["name"]
        found = self.page.files.get(name)
        if found is None or name == "index.html":
            raise web.HTTPNotFound()
        return send(request, found, "public, max-age=86400")

    async def data(self, request: web.Request) -> web.Response:
        if not self.allowed(request):
            return refused()
        after = parse_since(request.query)
        if after is None:
            return web.json_response({"error": "since: expected unix seconds"}, status=400)
        headers = {"Content-Type": "application/json", "Cache-Control": "no-store", **_SECURITY}
        return web.Response(body=await self.page.data(after), headers=headers)


def add_routes(
    app: web.Application,
    page: LivePage,
    allowed: Callable[[web.Request], bool],
) -> None:
    """``/`` (to the page), ``/ui``, ``/ui/data``, ``/ui/static/{name}``."""
    routes = _Routes(page, allowed)
    app.router.add_get("/", routes.root)
    app.router.add_get("/ui", routes.index)
    app.router.add_get("/ui/", routes.index)
    app.router.add_get("/ui/data", routes.data)
    app.router.add_get("/ui/static/{name}", routes.static)
