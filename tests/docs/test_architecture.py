"""docs/architecture.md's "How to add" held to the code: each recipe names places that exist,
as many as it says, and the code has no other place that would need the change (a family's
observations only in the mapping, a dialect's client only in its sim module, a consumer only
in the assembly)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import re
from pathlib import Path

import pytest

from llmobs.collectors.engine import ENGINES, PROVIDERS
from llmobs.export.metrics import catalogue
from llmobs.export.metrics.catalogue import (
    ACTIVE,
    ITL,
    ITL_SQUARES,
    MALFORMED,
    OBSERVER_ERRORS,
    QUEUE_DEPTH,
    USAGE_BY_TYPE,
    MetricDef,
    request_metrics,
)
from llmobs.observe import dialects
from llmobs.observe.dialects import OTHER_ROUTE, Route
from llmobs.sim.dialects import DIALECTS as SIM_DIALECTS
from llmobs.tools import traffic
from tests.support import FIXTURES, ROOT
from tests.support.servers import SimFactory

DOC = ROOT / "docs" / "architecture.md"
LLMOBS = ROOT / "llmobs"
# the families the sink and the OTLP consumer keep themselves: the label-less series (counted
# live) and the per-token ITL (binned a window at a time); every other request family is the
# mapping's
KEPT_BY_EXPORTERS = {ACTIVE, QUEUE_DEPTH, OBSERVER_ERRORS, MALFORMED, ITL, ITL_SQUARES}


def _recipes() -> dict[str, list[str]]:
    """Each recipe of "How to add", by its title, as its numbered steps."""
    text = DOC.read_text()
    section = text.split("## How to add", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=\*\*)", section):
        title = re.match(r"\*\*(.+?)\*\*", block)
        if title is not None:
            out[title.group(1)] = re.findall(r"^\d+\. (.+(?:\n {3}.+)*)", block, re.MULTILINE)
    return out


RECIPES = _recipes()


@pytest.mark.parametrize(
    ("title", "places"),
    [
        ("A per-request metric family: three places.", 3),
        ("A dialect (an engine's API): five places.", 5),
        ("An engine's gauges: two places.", 2),
        ("A consumer of each finished request: two places.", 2),
    ],
)
def test_each_recipe_has_as_many_places_as_it_says_and_they_exist(title: str, places: int) -> None:
    steps = RECIPES[title]
    assert len(steps) == places, steps
    for step in steps:
        for path in re.findall(r"`((?:llmobs|tests|docs)/[^`]+)`", step):
            assert list(ROOT.glob(path.replace("<name>", "*"))), path


def _names_used(module: Path) -> set[str]:
    """Every name a module's code reads (imports and uses alike)."""
    tree = ast.parse(module.read_text())
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _constant_names(metrics: set[MetricDef]) -> set[str]:
    return {
        name for name, value in vars(catalogue).items()
        if isinstance(value, MetricDef) and value in metrics
    }  # fmt: skip


def test_a_request_familys_observations_are_the_mappings_alone() -> None:
    """The exporters name no request family but those they keep themselves: a family added
    to the catalogue and the mapping reaches /metrics and OTLP with no change to either."""
    observed = {m for latest in (False, True) for m in request_metrics(latest)}
    observed -= KEPT_BY_EXPORTERS
    names = _constant_names(observed)
    for exporter in ("sink.py", "otel.py"):
        used = _names_used(LLMOBS / "export" / "metrics" / exporter)
        assert not used & names, (exporter, used & names)
    mapping = _names_used(LLMOBS / "export" / "metrics" / "mapping.py")
    by_kind = set(USAGE_BY_TYPE.values())  # the mapping reaches these through their table
    missing = {m.name for m in observed - by_kind if not _constant_names({m}) & mapping}
    assert not missing


def _routes() -> set[Route]:
    """The HTTP APIs' routes (gRPC's methods: ``test_every_grpc_method_...``)."""
    return {v for v in vars(dialects).values() if isinstance(v, Route) and not v.grpc} - {
        OTHER_ROUTE
    }


def test_every_dialect_has_its_sim_side_its_client_and_a_transcript() -> None:
    names = {route.name for route in _routes()}
    assert names == set(SIM_DIALECTS)
    assert tuple(SIM_DIALECTS) == traffic.DIALECTS  # the traffic tool adds no dialect of its own
    transcripts = [p.name for p in (FIXTURES / "streams").glob("*.json")]
    for name in names:
        assert any(t.startswith(f"{name}-") or t == f"{name}.json" for t in transcripts), name
        path, body = SIM_DIALECTS[name].request("m", "hello", 8, True)
        assert path.startswith("/") and isinstance(body, dict)
        # the sidecar measures the client's request as the dialect it was made for
        assert dialects.route_for_path(path).name == name


async def test_every_grpc_method_measured_is_one_the_sim_serves(start_sim: SimFactory) -> None:
    """Each gRPC method the sidecar measures (``GRPC_METHODS``) the sim answers: an empty
    request gets the method's own answer or refusal, never UNIMPLEMENTED."""
    from grpc import StatusCode, aio  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415

    from llmobs.sim.grpc_engine import start_grpc  # noqa: PLC0415

    sim = await start_sim(prefill_base=0.0, decode_base=0.0)
    server, port = await start_grpc(sim.engine, "127.0.0.1", 0)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            codes = {}
            for path in dialects.GRPC_METHODS:
                call = channel.unary_stream(path, lambda b: b, lambda b: b)(b"")
                with contextlib.suppress(aio.AioRpcError):  # (its code is what is asked)
                    async with asyncio.timeout(10):
                        while await call.read() is not aio.EOF:
                            pass
                codes[path] = await call.code()
    finally:
        await server.stop(None)
    assert StatusCode.UNIMPLEMENTED not in codes.values(), codes


def test_every_engine_has_a_provider_name() -> None:
    assert set(PROVIDERS) == {spec.engine for spec in ENGINES}
    assert all(PROVIDERS.values())


def _consumers() -> set[str]:
    """Every class in llmobs/ with a ``consume(self, record)`` method."""
    found: set[str] = set()
    for path in LLMOBS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not any(
                isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases
            ):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if "consume" in methods:
                    found.add(node.name)
    return found


def test_every_consumer_is_assembled_in_the_app() -> None:
    consumers = _consumers()
    assert {"MetricsSink", "OtelMetrics", "Collectors"} <= consumers
    app = _names_used(LLMOBS / "app.py")
    assert consumers <= app, consumers - app
