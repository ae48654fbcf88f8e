"""A real Prometheus for tests: started on 127.0.0.1 on a free port with a temporary data
directory, scraping and evaluating every second, killed at the end.

Also the load that feeds it (the project's closed-loop streaming clients, cancelled at the
end) and the paths of the shipped rule files. Prometheus, promtool and amtool come from the
Debian packages ``prometheus`` and ``prometheus-alertmanager`` (.ci/run installs them); tests
that need one are skipped, saying so, where it is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml

from llmobs.tools.traffic import Workload, run_load
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]  # the repository
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "rules.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
_INSTALL = "install the Debian packages prometheus and prometheus-alertmanager (.ci/run does)"
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason=f"no prometheus: {_INSTALL}")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason=f"no promtool: {_INSTALL}")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason=f"no amtool: {_INSTALL}")

READY_TIMEOUT = 30.0


@dataclass(frozen=True)
class Target:
    """One scrape target: job name, base URL (``/metrics`` is scraped) and target labels."""

    job: str
    url: str
    labels: Mapping[str, str] = field(default_factory=dict)


def fast_alerts(for_: str = "2s") -> str:
    """alerts.yml with every ``for:`` shortened, for an end-to-end run that takes seconds.

    Only the hold time changes: expressions, thresholds and windows are the shipped ones.
    """
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = for_
    return yaml.safe_dump(doc, sort_keys=False)


def config(
    targets: Sequence[Target],
    rule_files: Sequence[str],
    remote_write: str = "",
    external_labels: Mapping[str, str] | None = None,
) -> str:
    """A configuration scraping ``targets`` every second; with ``remote_write``, sending every
    sample (native histograms included) to that receiver within a second of its scrape."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for t in targets:
        jobs.setdefault(t.job, []).append(
            {"targets": [urlsplit(t.url).netloc], "labels": dict(t.labels)}
        )
    every: dict[str, Any] = {
        "scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"
    }  # fmt: skip
    if external_labels:
        every["external_labels"] = dict(external_labels)
    doc: dict[str, Any] = {"global": every}
    if rule_files:
        doc["rule_files"] = list(rule_files)
    doc["scrape_configs"] = [{"job_name": job, "static_configs": sc} for job, sc in jobs.items()]
    if remote_write:
        doc["remote_write"] = [{
            "url": remote_write, "send_native_histograms": True,
            "queue_config": {"batch_send_deadline": "500ms", "min_backoff": "100ms"},
        }]  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


class Prometheus:
    """``async with Prometheus(tmp_path, targets, rules) as prom:`` then ``await prom.query()``.

    ``rules`` maps file names to their text; they are written next to the configuration.
    A fleet's shapes: ``agent`` (scrape and remote-write only: no storage, no query API, no
    rules), ``remote_write`` (where to send what it scrapes), ``receiver`` (accept remote
    writes: a central Prometheus that evaluates the rules over every node's samples).
    """

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[Target],
        rules: Mapping[str, str] | None = None,
        features: Sequence[str] = (),
        *,
        agent: bool = False,
        remote_write: str = "",
        receiver: bool = False,
        external_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.features = tuple(features) + (("agent",) if agent else ())
        assert PROMETHEUS is not None, _INSTALL
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent, self.receiver = agent, receiver
        for name, text in (rules or {}).items():
            (workdir / name).write_text(text)
        text = config(targets, list(rules or {}), remote_write, external_labels)
        (workdir / "prometheus.yml").write_text(text)
        self.log = workdir / "prometheus.log"
        self._proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Prometheus:
        with self.log.open("wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                str(PROMETHEUS),
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.{'agent' if self.agent else 'tsdb'}.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *(["--web.enable-remote-write-receiver"] if self.receiver else []),
                "--log.level=warn",
                *(f"--enable-feature={f}" for f in self.features),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Terminate Prometheus (killed if it has not exited 10 s later)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout=10)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT
        async with aiohttp.ClientSession() as session:
            while True:
                assert self._proc is not None
                if self._proc.returncode is not None:
                    raise AssertionError(f"prometheus exited:\n{self.log.read_text()}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(self.url + "/-/ready") as r:
                        if r.status == 200:
                            return
                if loop.time() > deadline:
                    raise AssertionError(f"prometheus not ready:\n{self.log.read_text()}")
                await asyncio.sleep(0.1)

    async def api(self, path: str, **params: str) -> Any:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/api/v1/{path}", params=params) as r,
        ):
            body = await r.json()
        assert body["status"] == "success", (path, params, body)
        return body["data"]

    async def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """Evaluate ``expr`` now: (labels, value) per sample of the instant vector."""
        data = await self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        assert data["resultType"] == "vector", data
        return [(s["metric"], float(s["value"][1])) for s in data["result"]]

    async def series(self, selector: str) -> list[dict[str, str]]:
        result: list[dict[str, str]] = await self.api("series", **{"match[]": selector})
        return result

    async def alerts(self) -> list[dict[str, Any]]:
        data = await self.api("alerts")
        result: list[dict[str, Any]] = data["alerts"]
        return result

    def text_log(self) -> str:
        return self.log.read_text(errors="replace")


async def until(prom: Prometheus, query: str, value: float) -> None:
    """Wait (30 s at most) until a sample of ``query`` is ``value`` (scraped, remote-written)."""
    deadline = asyncio.get_running_loop().time() + 30.0
    while not [v for _, v in await prom.query(query) if v == value]:
        assert asyncio.get_running_loop().time() < deadline, f"Prometheus never saw {query}"
        await asyncio.sleep(0.3)


def finite(samples: list[tuple[dict[str, str], float]]) -> bool:
    """Non-empty, and every value a finite number."""
    return bool(samples) and all(math.isfinite(v) for _, v in samples)


@contextlib.asynccontextmanager
async def streaming_load(
    url: str, model: str, concurrency: int = 4, seed: int = 0, dialect: str = "openai",
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[None]:  # fmt: skip
    """Closed-loop streaming clients (short prompts) until the block ends, then cancelled
    (``tls``: how an https ``url`` is trusted)."""
    workload = Workload(model, seed=seed, long_share=0.0, dialect=dialect)
    task = asyncio.ensure_future(
        run_load(
            url, workload, duration=3600.0, concurrency=concurrency, on_result=_ignore, tls=tls
        )
    )
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _ignore(result: object) -> None:
    pass
