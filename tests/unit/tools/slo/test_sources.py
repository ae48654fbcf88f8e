"""The one reading of both reports' sources, against real servers on loopback: a sidecar's
/metrics (and what is not one: the engine's page through the proxy's port, a JSON answer, a
404, nothing listening, a token missing or refused) and a Prometheus query API (a small fake
one, serving what Prometheus answers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from llmobs.config.options import ConfigError
from llmobs.tools.slo import attainment
from llmobs.tools.slo.samples import Sample
from llmobs.tools.slo.sources import CannotJudge, Source, check_url, query_prometheus, read_page
from tests.support.ports import free_port
from tests.support.servers import AppFactory, SidecarFactory, SimFactory

NOT_A_SIDECAR = (
    "{url} is not an llmobs sidecar's /metrics (no llmobs_ series): point --metrics-url at the "
    "sidecar's --metrics-port, not the engine's"
)


async def _cannot(read: Callable[[], Any]) -> str:
    """Why ``read`` (blocking: urllib) cannot judge, run off the loop the servers run on."""
    with pytest.raises(CannotJudge) as caught:
        await asyncio.to_thread(read)
    return str(caught.value)


async def test_an_engines_page_is_told_from_a_sidecars(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """The proxy's port passes the engine's /metrics through: an answer in the exposition
    format, but no llmobs series in it."""
    sim = await start_sim()
    side = await start_sidecar(sim.url)
    engine = side.url + "/metrics"
    assert await _cannot(lambda: read_page(engine, "", attainment.FAMILIES)) == (
        NOT_A_SIDECAR.format(url=engine)
    )
    assert await _cannot(lambda: Source(sim.url + "/metrics").read({})) == (
        NOT_A_SIDECAR.format(url=sim.url + "/metrics")
    )
    # the sidecar's own page: read, with nothing judged yet
    assert await asyncio.to_thread(read_page, side.metrics_url + "/metrics", "", {"x"}) == []


async def test_answers_that_are_not_metrics(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim()
    side = await start_sidecar(sim.url)
    models, missing = side.url + "/v1/models", side.metrics_url + "/nothing-here"
    assert await _cannot(lambda: read_page(models, "", {"x"})) == (
        f"{models} answered with something that is not a Prometheus metrics page: point "
        "--metrics-url at a sidecar's /metrics (on its --metrics-port)"
    )
    assert await _cannot(lambda: read_page(missing, "", {"x"})) == (
        f"{missing} answered HTTP 404 Not Found: point --metrics-url at a sidecar's /metrics "
        "(on its --metrics-port)"
    )
    nowhere = f"http://127.0.0.1:{free_port()}/metrics"
    assert await _cannot(lambda: read_page(nowhere, "", {"x"})) == (
        f"nothing is listening at {nowhere} (connection refused): check that the sidecar is "
        "up and that --metrics-url is its /metrics"
    )


async def test_a_sidecar_behind_its_metrics_token(start_sidecar: SidecarFactory) -> None:
    side = await start_sidecar(f"http://127.0.0.1:{free_port()}", metrics_token="s3cret")
    url = side.metrics_url + "/metrics"
    assert await _cannot(lambda: read_page(url, "", {"x"})) == (
        f"{url} requires a metrics token (HTTP 401): pass the sidecar's token to llmobs slo "
        "with --metrics-token or LLMOBS_METRICS_TOKEN"
    )
    assert (await _cannot(lambda: read_page(url, "wrong", {"x"}))).startswith(
        f"{url} refused the metrics token given (HTTP 401): "
    )
    found = await asyncio.to_thread(Source(url, "s3cret").read, {"llmobs_slo_target": ""})
    assert found and {name for name, _, _ in found} == {"llmobs_slo_target"}  # only those asked


def _prometheus(answers: list[dict[str, Any]], asked: list[dict[str, str]]) -> web.Application:
    """A query API that gives ``answers`` in turn and notes each query's parameters."""

    async def query(request: web.Request) -> web.Response:
        asked.append(dict(request.query))
        return web.json_response(answers[len(asked) - 1], status=200 if len(asked) == 1 else 400)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    return app


async def test_prometheus_answers_each_query_under_its_familys_name(
    start_app: AppFactory,
) -> None:
    result = [{"metric": {"pod": "a"}, "value": [1.0, "3"]}, {"metric": {}, "value": [1, "NaN"]}]
    asked: list[dict[str, str]] = []
    base = await start_app(_prometheus(
        [{"status": "success", "data": {"resultType": "vector", "result": result}},
         {"status": "error", "error": "bad_data: too many points"}], asked,
    ))  # fmt: skip
    samples: list[Sample] = await asyncio.to_thread(
        query_prometheus, base + "/", {"llmobs_stalls_total": "sum(llmobs_stalls_total)"}, 1234.5
    )
    assert samples[0] == ("llmobs_stalls_total", {"pod": "a"}, 3.0)
    assert samples[1][0] == "llmobs_stalls_total" and samples[1][2] != samples[1][2]  # NaN
    assert asked == [{"query": "sum(llmobs_stalls_total)", "time": "1234.500"}]
    # the second answer: Prometheus refused the query
    source = Source(base, window="5m")
    assert await _cannot(lambda: source.read({"x": "up[99999999999y]"})) == (
        f"Prometheus at {base} refused the query 'up[99999999999y]' (HTTP 400): bad_data: too "
        "many points; check --range and --end"
    )


async def test_what_is_not_prometheus(start_sim: SimFactory) -> None:
    sim = await start_sim()
    assert await _cannot(lambda: query_prometheus(sim.url, {"x": "up"})) == (
        f"{sim.url} answered HTTP 404 Not Found, not as Prometheus's query API: check that "
        "Prometheus is up and that --prometheus is its base URL (http://prometheus:9090)"
    )
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert (await _cannot(lambda: query_prometheus(nowhere, {"x": "up"}))).startswith(
        f"nothing is listening at {nowhere} (connection refused): check that Prometheus is up"
    )


def test_a_source_says_where_it_reads() -> None:
    assert str(Source("http://s:9464/metrics")) == "http://s:9464/metrics"
    assert str(Source("http://prom:9090", window="28d")) == "http://prom:9090, the last 28d"
    assert Source("http://s:9464/metrics").sidecar and not Source("http://p", window="1h").sidecar


@pytest.mark.parametrize("url", ["s:9464/metrics", "ftp://s/metrics", "http://", "http://s:x/"])
def test_only_http_urls(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^--metrics-url: expected an http\(s\) URL, got "):
        check_url("--metrics-url", url)
    check_url("--metrics-url", "https://s:9464/metrics")
