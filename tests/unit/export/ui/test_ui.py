"""The live page's parts (``llmobs.export.ui``): its files, the names page.js draws against the
ring's, a tick from the sink and the gauges' source, and its routes over loopback on a clock
the test turns (tests/e2e/test_ui.py runs it in a sidecar, test_ui_browser.py in a browser)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping

import aiohttp
import pytest
from aiohttp import web
from multidict import MultiDict
from prometheus_client import CollectorRegistry

from llmobs.export.live import ALL, GLOBAL, PER_MODEL, Gauge
from llmobs.export.ui import INLINE_POINTS, STATIC, LivePage, _files, add_routes, parse_since
from tests.support.metrics import replay
from tests.support.recording import recording
from tests.support.servers import AppFactory

PAGE_JS = (STATIC / "page.js").read_text()
# the ring's per-model series the page does not draw: all stalls, drawn by cause instead
NOT_DRAWN = {"stalls"}


def charts() -> dict[str, tuple[str, list[str]]]:
    """page.js's ``CHARTS``: each chart's scope and the series it draws, by name."""
    found = {}
    for chart, scope, series in re.findall(
        r'^  (\w+): \{ scope: "(\w+)"(.*?)\] ?\] \},$', PAGE_JS, re.MULTILINE | re.DOTALL
    ):
        found[chart] = (scope, re.findall(r'\["(\w+)", "', series))
    return found


def test_page_js_draws_the_ring_s_series_by_their_names() -> None:
    """The names live once in ``export.live``; page.js names them to draw them: each drawn
    series is one the ring writes, in its scope, and every series the ring writes is drawn."""
    drawn = charts()
    assert len(drawn) == PAGE_JS.count("scope:") > 0
    by_scope: dict[str, list[str]] = {"global": [], "model": []}
    for scope, names in drawn.values():
        by_scope[scope] += names
    assert sorted(by_scope["global"]) == sorted(GLOBAL)
    assert sorted(by_scope["model"]) == sorted(set(PER_MODEL) - NOT_DRAWN)
    assert {gauge.value for gauge in Gauge} <= set(by_scope["global"])
    # and the data's own keys, as the page reads them
    for key in ("t", "global", "models", "objectives", "seconds", "currency"):
        assert f"fresh.{key}" in PAGE_JS, key
    assert f'|| "{ALL}"' in PAGE_JS


def test_every_file_is_read_once_with_its_type_and_version() -> None:
    files = _files()
    assert {"index.html", "page.js", "page.css", "uplot-LICENSE.txt"} <= set(files)
    assert files["page.js"].content_type == "text/javascript; charset=utf-8"
    assert files["uplot-LICENSE.txt"].content_type == "text/plain; charset=utf-8"
    for name, found in files.items():
        assert found.body == (STATIC / name).read_bytes()
        assert found.etag == f'"{hashlib.sha256(found.body).hexdigest()[:16]}"'


@pytest.mark.parametrize(
    ("query", "since"),
    [({}, 0.0), ({"since": "1764115200.5"}, 1764115200.5), ({"since": "x"}, None),
     ({"since": ""}, None)],
)  # fmt: skip
def test_since_is_a_number_or_refused(query: dict[str, str], since: float | None) -> None:
    assert parse_since(MultiDict(query)) == since


def seconds(start: float) -> Iterator[float]:
    """A clock the test turns: one whole second a tick."""
    now = start
    while True:
        yield now
        now += 1.0


def page_with_traffic(gauges: Mapping[str, float]) -> LivePage:
    sink, recorder = recording(CollectorRegistry(), 4)
    clock = seconds(1000.0)
    page = LivePage(sink, lambda: gauges, seconds=60, clock=lambda: next(clock))
    page.tick()
    replay(recorder, "llama", [20.0] * 9)
    return page


def test_a_tick_reads_the_sink_and_the_gauges_source() -> None:
    page = page_with_traffic({Gauge.ENGINE_WAITING: 3.0, Gauge.GPU_BANDWIDTH: 0.5})
    page.tick()
    data = page.ring.data()
    assert data["t"] == [1000.0, 1001.0]
    assert data["global"]["engine_waiting"] == [3.0, 3.0]
    assert data["global"]["gpu_bandwidth"] == [0.5, 0.5]
    assert data["global"]["engine_running"] == [None, None]  # not in the source: no value
    assert data["models"]["llama"]["tokens"] == [None, 10]  # a slot from its first request
    no_source = LivePage(recording(CollectorRegistry(), 4)[0], clock=lambda: 5.0)
    no_source.tick()
    assert no_source.ring.data()["global"]["engine_waiting"] == [None]


async def test_the_data_after_since_inline_or_in_a_thread() -> None:
    page = page_with_traffic({})
    for _ in range(INLINE_POINTS + 5):
        page.tick()
    ring = page.ring
    assert json.loads(await page.data(0.0)) == ring.data(0.0)  # a whole ring: in a thread
    last = ring.times[-1]
    assert json.loads(await page.data(last - 2)) == ring.data(last - 2)  # a poll: inline
    assert json.loads(await page.data(last))["t"] == []


async def test_the_routes_over_loopback(start_app: AppFactory) -> None:
    """What each route answers, the token checked by the admin app's function (here: a
    header), and ``since`` that the page polls with: the points after it, none twice."""
    page = page_with_traffic({Gauge.ENGINE_KV_CACHE: 0.25})
    app = web.Application()
    add_routes(app, page, lambda request: request.headers.get("X-Token") == "ok")
    url = await start_app(app)
    ok = {"X-Token": "ok"}
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/ui/data") as r:
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Basic ")
        async with s.get(url + "/ui/data?since=x", headers=ok) as r:
            assert r.status == 400
        async with s.get(url + "/ui/data", headers=ok) as r:
            assert r.headers["Cache-Control"] == "no-store"
            first = await r.json()
        assert first["t"] == [1000.0] and first["global"]["engine_kv_cache"] == [0.25]
        page.tick()
        async with s.get(url + f"/ui/data?since={first['t'][-1]}", headers=ok) as r:
            second = await r.json()
        assert second["t"] == [1001.0] and second["models"]["llama"]["requests"] == [1]
        async with s.get(url + "/ui", headers=ok, allow_redirects=False) as r:
            assert r.status == 302 and r.headers["Location"] == "/ui/"
        async with s.get(url + "/ui/", headers=ok) as r:
            etag = r.headers["ETag"]
            assert r.status == 200 and await r.read() == page.files["index.html"].body
        async with s.get(url + "/ui/", headers={**ok, "If-None-Match": etag}) as r:
            assert r.status == 304 and await r.read() == b""
        async with s.get(url + "/ui/static/index.html", headers=ok) as r:
            assert r.status == 404
