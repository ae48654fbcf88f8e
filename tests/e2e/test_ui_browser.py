"""The live page in a real browser: headless Chromium loads it while the simulated engine
queues requests and stalls, and the charts it drew hold that.

Chromium runs the page's own script against the sidecar (``--virtual-time-budget`` lets its
polls run), then its DOM is read: each chart says what it drew (``data-max``, per series). A
screenshot is saved next to the test's files, and to ``$LLMOBS_UI_SCREENSHOT`` when that is set
(how docs/live.png, the README's picture, is made). Where Chromium is not installed the test
skips, saying so; .ci/run installs Debian's ``chromium``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import pytest

from llmobs.tools.traffic import Call, stream_call
from tests.e2e.test_ui import ENGINE
from tests.support.servers import SidecarFactory, SimFactory, requests_shown

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: apt-get install chromium; .ci/run does)",
)


HOSTILE = '<b id="xss">m</b>'


class Charts(HTMLParser):
    """The chart sections of the page's DOM: id -> attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, str | None]] = {}
        self.body: dict[str, str | None] = {}
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.ids.add(found.get("id") or "")
        if tag == "section" and "chart" in (found.get("class") or ""):
            self.charts[found["id"] or ""] = found
        if tag == "body":
            self.body = found


async def chromium(*args: str) -> bytes:
    """Run headless Chromium; its stdout."""
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=6000", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


CHAT = Call("/v1/chat/completions", {"model": "chat-model", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip


async def drawn_page(page: str) -> tuple[str, Charts]:
    """The page's DOM once Chromium has run its script, and its charts."""
    dom = (await chromium("--dump-dom", page)).decode()
    charts = Charts()
    charts.feed(dom)
    return dom, charts


async def screenshot(page: str, shot: Path, variable: str) -> None:
    """The page as a reader sees it, saved at ``shot`` and, where ``variable`` names a path,
    there too (docs/live.png is made so)."""
    await chromium(f"--screenshot={shot}", "--window-size=1280,1500", page)
    _keep(shot, variable)


def _keep(shot: Path, variable: str) -> None:
    assert shot.stat().st_size > 20_000
    target = os.environ.get(variable)
    if target:
        shutil.copyfile(shot, target)


async def test_the_page_draws_the_queue_and_the_stutter(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url)
    chat = CHAT
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # two waves of four: the queue fills twice, streams stall
            results = await asyncio.gather(*(stream_call(session, side.url, chat)
                                             for _ in range(4)))  # fmt: skip
            assert all(r.ok for r in results)
        # a model name is a client's string: the page shows it as text, never as HTML
        hostile = Call(chat.path, {**chat.body, "model": HOSTILE})
        assert (await stream_call(session, side.url, hostile)).ok
    await side.live(lambda data: requests_shown(data) == 9)  # a tick after the last request
    page = side.metrics_url + "/ui/"
    dom, charts = await drawn_page(page)
    assert int(charts.body.get("data-polls") or 0) >= 1, dom[-3000:]
    assert "xss" not in charts.ids and "&lt;b id=" in dom  # an option's text, escaped
    drawn = {name: json.loads(c.get("data-max") or "{}") for name, c in charts.charts.items()
             if c.get("data-max")}  # fmt: skip
    # the queue: four requests at once on a one-at-a-time engine
    assert drawn["queue"]["prefill queue"] >= 2, drawn
    # the stutter: the stalls series is non-zero, and tokens came after gaps over 100 ms
    assert drawn["stalls"]["engine pause"] > 0, drawn  # by cause: the engine's own pause
    assert drawn["phases"]["other"] > 0.1, drawn  # the first token's wait, by phase
    assert drawn["itl"]["100-250 ms"] > 0 and drawn["itl"]["≤ 50 ms"] > 0, drawn
    assert drawn["ttft"]["p99"] > 0.3, drawn
    assert drawn["tokens"]["output tokens/s"] > 0
    # no GPU and no engine collector here: those charts stay hidden
    assert "hidden" in (charts.charts["gpu"].get("class") or "")
    # every chart drew as many points as the page holds
    points = {c.get("data-points") for c in charts.charts.values() if c.get("data-points")}
    assert len(points) == 1 and int(points.pop() or 0) >= 3
    await screenshot(page, tmp_path / "live.png", "LLMOBS_UI_SCREENSHOT")


# a price file as docs/metrics.md writes one: cents per million tokens, so a few requests cost
# a few hundred-thousandths of a euro a second
CHEAP = "currency: EUR\nprices:\n  '*': {input: 0.15, output: 0.60}\n"


async def test_the_cost_chart_shows_small_amounts_in_their_currency(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Issue 53: the cost axis read ``0, 0, 0`` with no currency; its ticks now carry the
    figures they need and the chart its currency."""
    prices = tmp_path / "prices.yaml"
    prices.write_text(CHEAP)
    sim = await start_sim(**ENGINE)
    side = await start_sidecar(sim.url, price_file=str(prices))
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(stream_call(session, side.url, CHAT) for _ in range(3)))
    assert all(r.ok for r in results)
    data = await side.live(lambda data: requests_shown(data) == 3)
    assert data["currency"] == "EUR"
    assert 0 < max(v or 0 for v in data["models"]["all"]["cost"]) < 1e-3  # what reads as 0
    page = side.metrics_url + "/ui/"
    dom, charts = await drawn_page(page)
    cost = charts.charts["cost"]
    assert "hidden" not in (cost.get("class") or ""), dom[-3000:]
    assert "What the tokens cost, per second (EUR)" in dom
    ticks = json.loads(cost.get("data-ticks") or "[]")
    assert len(set(ticks)) == len(ticks) >= 2, ticks  # no two ticks read the same
    assert any(float(t) > 0 for t in ticks), ticks
    await screenshot(page, tmp_path / "cost.png", "LLMOBS_UI_COST_SCREENSHOT")
