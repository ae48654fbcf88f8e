"""``llmobs slo`` and ``llmobs why`` as a user runs them: their flags checked, and the same
reading of a source, so the same sentence when it is not a sidecar's /metrics (a real sidecar
and the simulated engine on loopback)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json

import pytest

from llmobs.config.options import ConfigError
from llmobs.tools.slo.cli import add_slo_arguments, add_source_arguments, run_slo_cli, source_of
from llmobs.tools.slo.sources import Source
from tests.support.cli import cli
from tests.support.ports import free_port
from tests.support.servers import SidecarFactory, SimFactory


def _slo(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_slo_arguments(parser)
    return parser.parse_args(argv)


def _source(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_source_arguments(parser)
    return parser.parse_args(argv)


async def test_slo_and_why_say_the_same_of_an_engines_page(
    start_sim: SimFactory, start_sidecar: SidecarFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pointed at the proxy's port, whose /metrics is the engine's passed through, both say
    it is not a sidecar's and where to point them; neither says there is nothing yet."""
    sim = await start_sim()
    side = await start_sidecar(sim.url)
    engine = side.url + "/metrics"
    sentence = (
        f"{engine} is not an llmobs sidecar's /metrics (no llmobs_ series): point --metrics-url "
        "at the sidecar's --metrics-port, not the engine's.\n"
    )
    assert await asyncio.to_thread(cli, "slo", "--metrics-url", engine) == (2, "")
    assert capsys.readouterr().err == f"llmobs slo: cannot judge: {sentence}"
    assert await asyncio.to_thread(cli, "why", "--metrics-url", engine) == (2, "")
    assert capsys.readouterr().err == f"llmobs why: {sentence}"
    code, out = await asyncio.to_thread(cli, "why", "--metrics-url", engine, "--json")
    assert (code, json.loads(out)) == (2, {"label_sets": [], "error": sentence[:-2]})
    # the sidecar's own page: a sidecar's, with nothing slow counted yet
    assert await asyncio.to_thread(cli, "why", "--metrics-url", side.metrics_url + "/metrics") == (
        2, "")  # fmt: skip
    assert "nothing slow counted yet at " in capsys.readouterr().err


def test_the_source_the_flags_name() -> None:
    url = "http://127.0.0.1:9464/metrics"
    assert source_of(_source("--metrics-url", url), {}) == Source(url)
    env = {"LLMOBS_METRICS_TOKEN": "from-env"}
    assert source_of(_source("--metrics-url", url), env).token == "from-env"
    assert source_of(_source("--metrics-url", url, "--metrics-token", ""), env).token == ""
    prometheus = _source("--prometheus", "http://p:9090", "--range", "28d", "--end", "12.5")
    assert source_of(prometheus, env) == Source("http://p:9090", window="28d", end=12.5)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--prometheus", "http://p:9090", "--range", "a week"], "--range"),
        (["--prometheus", "p:9090"], "--prometheus"),
        (["--metrics-url", "localhost:9464"], "--metrics-url"),
    ],
)
def test_a_source_badly_named_is_a_configuration_error(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag}: "):
        source_of(_source(*argv), {})


def test_by_takes_target_label_names_and_prometheus_only() -> None:
    for argv in (["--metrics-url", "http://127.0.0.1:1/metrics", "--by", "pod"],
                 ["--prometheus", "http://127.0.0.1:1", "--by", "pod name"],
                 ["--prometheus", "http://127.0.0.1:1", "--by", "pod,verdict"]):  # fmt: skip
        with pytest.raises(ConfigError, match="--by"):
            run_slo_cli(_slo(*argv), io.StringIO(), {})


def test_a_target_is_a_share() -> None:
    for target in ("0", "1", "1.5"):
        with pytest.raises(ConfigError, match=r"^--target: must be above 0 and below 1$"):
            run_slo_cli(_slo("--metrics-url", "http://127.0.0.1:1/", "--target", target), None)


def test_by_namespace_and_pod_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """Accepted, it goes on to read Prometheus: here none, so it cannot judge (2)."""
    args = _slo("--prometheus", f"http://127.0.0.1:{free_port()}", "--by", "namespace,pod")
    assert run_slo_cli(args, io.StringIO(), {}) == 2
    assert "cannot judge" in capsys.readouterr().err
