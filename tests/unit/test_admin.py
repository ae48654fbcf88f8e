"""The admin application (``llmobs.admin``) over loopback: the token check /metrics and the live
page share, the format and encoding /metrics answers in, and what /readyz says of the engine
and of a sidecar draining. (Whole sidecars: tests/e2e/test_shutdown.py, test_hostile.py.)"""

from __future__ import annotations

import base64
import gzip

import aiohttp
import pytest
from aiohttp import web

from llmobs.admin import Lifecycle, _authorized, build_admin_app
from llmobs.config.settings import Settings
from llmobs.export.metrics.exposition import Format
from llmobs.export.telemetry import build_telemetry
from llmobs.export.ui import LivePage
from tests.support.ports import free_port
from tests.support.recording import recording
from tests.support.servers import AppFactory

TOKEN = "s3cret"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("given", "ok"),
    [(f"Bearer {TOKEN}", True), (basic("anyone", TOKEN), True), (basic("", TOKEN), True),
     ("basic " + basic("x", TOKEN)[6:], True), ("Bearer nope", False), (TOKEN, False),
     (f"bearer {TOKEN}", False), (basic(TOKEN, "x"), False), ("Basic !!!", False),
     ("Basic " + "é", False), ("Bearer \udcff", False), ("", False)],
)  # fmt: skip
def test_the_token_as_a_bearer_or_a_basic_password(given: str, ok: bool) -> None:
    assert _authorized(given, TOKEN) is ok


async def engine_health(start_app: AppFactory, status: int) -> str:
    """An engine whose /health answers ``status``."""

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=status)

    app = web.Application()
    app.router.add_get("/health", health)
    return await start_app(app)


async def test_metrics_and_the_page_take_the_same_token(start_app: AppFactory) -> None:
    settings = Settings(upstream=await engine_health(start_app, 200), metrics_token=TOKEN)
    telemetry = build_telemetry(self_metrics=False)
    sink, _ = recording(telemetry.registry)
    url = await start_app(build_admin_app(settings, telemetry, live=LivePage(sink)))
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            for path in ("/metrics", "/ui/data"):
                async with s.get(url + path) as r:
                    assert r.status == 401, path
                async with s.get(url + path, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    assert r.status == 200, path
            async with s.get(url + "/healthz") as r:  # no token: a probe's
                assert r.status == 200 and await r.json() == {"status": "ok"}
    finally:
        telemetry.shutdown()


@pytest.mark.parametrize(
    ("accept", "encoding", "fmt", "gzipped"),
    [("", "", Format.TEXT, False), ("application/openmetrics-text", "gzip", Format.OPENMETRICS,
      True), (Format.PROTOBUF.value, "br", Format.PROTOBUF, False)],
)  # fmt: skip
async def test_metrics_in_the_format_and_coding_asked(
    start_app: AppFactory, accept: str, encoding: str, fmt: Format, gzipped: bool
) -> None:
    settings = Settings(upstream=await engine_health(start_app, 200))
    telemetry = build_telemetry(self_metrics=False)
    recording(telemetry.registry)
    url = await start_app(build_admin_app(settings, telemetry))
    headers = {"Accept": accept, "Accept-Encoding": encoding}
    try:
        async with (
            aiohttp.ClientSession(auto_decompress=False) as s,
            s.get(url + "/metrics", headers=headers) as r,
        ):
            body = await r.read()
            assert r.headers["Content-Type"] == fmt.value
            assert r.headers["Vary"] == "Accept, Accept-Encoding"
            assert (r.headers.get("Content-Encoding") == "gzip") is gzipped
        text = gzip.decompress(body) if gzipped else body
        assert text.endswith(b"# EOF\n") is (fmt is Format.OPENMETRICS)
    finally:
        telemetry.shutdown()


async def test_ready_when_the_engine_answers_and_not_draining(start_app: AppFactory) -> None:
    lifecycle = Lifecycle()
    telemetry = build_telemetry(self_metrics=False)
    engines = {
        "up": await engine_health(start_app, 200),
        "loading": await engine_health(start_app, 503),
        "gone": f"http://127.0.0.1:{free_port()}",
    }
    answers = {}
    async with aiohttp.ClientSession() as s:
        for name, engine in engines.items():
            app = build_admin_app(Settings(upstream=engine), telemetry, lifecycle=lifecycle)
            async with s.get(await start_app(app) + "/readyz") as r:
                answers[name] = (r.status, (await r.json())["detail"])
        lifecycle.draining = True  # an engine that answers, and the sidecar on its way out
        app = build_admin_app(Settings(upstream=engines["up"]), telemetry, lifecycle=lifecycle)
        async with s.get(await start_app(app) + "/readyz") as r:
            answers["draining"] = (r.status, (await r.json())["detail"])
    telemetry.shutdown()
    assert answers == {
        "up": (200, "upstream answered 200"),
        "loading": (503, "upstream answered 503"),
        "gone": (503, "upstream unreachable: ClientConnectorError"),
        "draining": (503, "draining"),
    }
