"""The command line as a user runs it: real processes, real ports, signals."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp

from tests.support.ports import SERVE, SIM, listening, port_of, refused_port
from tests.support.prom import Prometheus, needs_prometheus
from tests.support.servers import SidecarFactory, SimFactory, eventually


async def test_serve_and_sim_processes_relay_and_stop_on_sigterm() -> None:
    """Both on port 0, as they say once listening: no port picked here that another
    socket could take before they bind it."""
    env = {**os.environ, "LLMOBS_HOST": "127.0.0.1", "LLMOBS_METRICS_HOST": "127.0.0.1",
           "LLMOBS_PORT": "0", "LLMOBS_METRICS_PORT": "0"}  # fmt: skip
    sim, (sim_port,), _ = await listening(
        "sim", "--port", "0", "--decode-base", "0.001", pattern=SIM, env=env
    )
    try:
        env["LLMOBS_UPSTREAM"] = f"http://127.0.0.1:{sim_port}"
        side, (port, metrics_port), logged = await listening("serve", pattern=SERVE, env=env)
    except BaseException:
        sim.send_signal(signal.SIGTERM)
        await sim.wait()
        raise
    try:
        body = {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": True}
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                assert r.status == 200
                assert (await r.read()).endswith(b"data: [DONE]\n\n")
            async with s.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                text = await r.text()
            async with s.get(f"http://127.0.0.1:{metrics_port}/readyz") as r:
                assert r.status == 200
        assert re.search(r'llmobs_requests_total\{[^}]*operation_name="text_completion"', text)
    finally:
        for proc in (side, sim):
            proc.send_signal(signal.SIGTERM)
        outputs = [await asyncio.wait_for(proc.communicate(), 10) for proc in (side, sim)]
    assert [side.returncode, sim.returncode] == [0, 0]
    logged += outputs[0][0].decode()
    assert f"live page: http://127.0.0.1:{metrics_port}/ui/" in logged, logged
    # what was configured, said once at start (tests/unit/test_announce.py: each line)
    for line in ("objectives: ", "tenants: off", "prices: off", "collectors: ", "transports: "):
        assert logged.count(f"llmobs: {line}") == 1, logged
    # a drain's start and end, each said once (nothing was in flight any more)
    assert "draining: 0 requests in flight, up to 60 s for them to end" in logged, logged
    assert re.search(r"drained in \d+\.\d s: shutting down", logged), logged


# -- the errors a new user hits: one sentence, a distinct exit code, no traceback -------------


def _environ(**extra: str) -> dict[str, str]:
    """This process's environment without any LLMOBS_* variable (a token there would change
    what ``llmobs slo`` sends), plus ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMOBS_")}
    return {**clean, **extra}


async def _llmobs(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``python -m llmobs ARGV`` to its end: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", *argv, env=env or _environ(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_port_taken_is_one_sentence_naming_the_flag_and_exit_2() -> None:
    loopback = ["--host", "127.0.0.1", "--metrics-host", "127.0.0.1"]
    first, (port, metrics_port), _ = await listening(
        "serve", *loopback, "--port", "0", "--metrics-port", "0", "--engine-scrape-interval",
        "0", pattern=SERVE, env=_environ(),
    )  # fmt: skip
    try:
        # (command, its arguments, the port it cannot have, how that port is set)
        cases = [
            ("serve", ["--port", str(port), "--metrics-port", "0", *loopback],
             port, "--port / LLMOBS_PORT"),
            ("serve", ["--port", "0", "--metrics-port", str(metrics_port), *loopback],
             metrics_port, "--metrics-port / LLMOBS_METRICS_PORT"),
            ("sim", ["--host", "127.0.0.1", "--port", str(port)], port, "--port / LLMOBS_SIM_PORT"),
            ("demo", ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0",
                      "--duration", "1", "--linger", "0"], port, "--port"),
            ("demo", ["--host", "127.0.0.1", "--port", "0", "--metrics-port", str(metrics_port),
                      "--duration", "1", "--linger", "0"], metrics_port, "--metrics-port"),
        ]  # fmt: skip
        results = await asyncio.gather(*(_llmobs(cmd, *argv) for cmd, argv, _, _ in cases))
    finally:
        first.send_signal(signal.SIGTERM)
        await asyncio.wait_for(first.communicate(), 10)
    for (command, _, taken, how), (code, out, err) in zip(cases, results, strict=True):
        want = (
            f"llmobs {command}: 127.0.0.1:{taken} is already in use ({how}): stop the process "
            "listening there, or choose another port."
        )
        assert code == 2, (command, how, err)
        assert "Traceback" not in err, err
        assert err.strip().splitlines()[-1] == want, err
        assert "load:" not in out  # the demo stopped before any load


async def test_slo_cannot_judge_exits_2_with_a_sentence(start_sidecar: SidecarFactory) -> None:
    with refused_port() as closed:
        await _slo_refused(f"http://127.0.0.1:{port_of(closed)}/metrics")
        # a sidecar that wants its metrics token, and has judged no request yet
        side = await start_sidecar(f"http://127.0.0.1:{port_of(closed)}", metrics_token="s3cret")
    await _slo_unjudged(side.metrics_url + "/metrics")


async def _slo_refused(nowhere: str) -> None:
    code, out, err = await _llmobs("slo", "--metrics-url", nowhere)
    assert code == 2, err
    assert err == (
        f"llmobs slo: cannot judge: nothing is listening at {nowhere} (connection refused): "
        "check that the sidecar is up and that --metrics-url is its /metrics.\n"
    )
    assert out == ""


async def _slo_unjudged(metrics: str) -> None:
    code, _, err = await _llmobs("slo", "--metrics-url", metrics)
    assert code == 2, err
    assert err == (
        f"llmobs slo: cannot judge: {metrics} requires a metrics token (HTTP 401): pass the "
        "sidecar's token to llmobs slo with --metrics-token or LLMOBS_METRICS_TOKEN.\n"
    )
    code, _, err = await _llmobs("slo", "--metrics-url", metrics, "--metrics-token", "wrong")
    assert code == 2, err
    assert f"{metrics} refused the metrics token given (HTTP 401)" in err
    # the token from the environment, as `serve` reads it: read, but nothing judged yet
    with_token = _environ(LLMOBS_METRICS_TOKEN="s3cret")
    code, out, err = await _llmobs("slo", "--metrics-url", metrics, env=with_token)
    assert code == 2, err
    assert err.startswith(f"llmobs slo: cannot judge: no request judged yet at {metrics}: ")
    assert "Traceback" not in err and len(err.splitlines()) == 1
    code, out, err = await _llmobs("slo", "--metrics-url", metrics, "--json", env=with_token)
    report = json.loads(out)
    assert code == 2
    assert (report["passed"], report["outcome"], report["label_sets"]) == (
        False, "unjudged", []
    )  # fmt: skip
    assert report["error"].startswith("no request judged yet")


async def test_slo_judges_a_sidecar_behind_its_token(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(decode_base=0.001, output_tokens_min=4, output_tokens_max=4)
    side = await start_sidecar(sim.url, metrics_token="s3cret", slo_ttft=30.0, slo_target=0.9)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with (
        aiohttp.ClientSession() as s,
        s.post(side.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
        await r.read()
    await eventually(lambda: side.value("llmobs_slo_requests_total") == 1)
    metrics = side.metrics_url + "/metrics"
    code, out, err = await _llmobs("slo", "--metrics-url", metrics, "--metrics-token", "s3cret")
    assert code == 0, err
    assert out.endswith("all objectives met\n"), out
    # the token from the environment; the outcome in the JSON (missed, 1: tests/e2e/test_slo.py)
    code, out, err = await _llmobs(
        "slo", "--metrics-url", metrics, "--json", env=_environ(LLMOBS_METRICS_TOKEN="s3cret")
    )
    assert code == 0, err
    assert json.loads(out)["outcome"] == "met"


async def test_slo_without_prometheus_exits_2() -> None:
    with refused_port() as closed:
        nowhere = f"http://127.0.0.1:{port_of(closed)}"
        code, _, err = await _llmobs("slo", "--prometheus", nowhere)
    assert code == 2, err
    assert err == (
        f"llmobs slo: cannot judge: nothing is listening at {nowhere} (connection refused): "
        "check that Prometheus is up and that --prometheus is its base URL "
        "(http://prometheus:9090).\n"
    )


@needs_prometheus
async def test_slo_against_a_prometheus_with_nothing_judged_or_a_query_it_refuses(
    tmp_path: Path,
) -> None:
    async with Prometheus(tmp_path, []) as prom:
        code, _, err = await _llmobs("slo", "--prometheus", prom.url, "--range", "5m")
        assert code == 2, err
        assert err.startswith(
            f"llmobs slo: cannot judge: no request judged at {prom.url} over the last 5m: "
        ), err
        code, _, err = await _llmobs("slo", "--prometheus", prom.url, "--range", "99999999999y")
    assert code == 2, err
    assert f"Prometheus at {prom.url} refused the query" in err
    assert "duration out of range; check --range and --end." in err
    assert "Traceback" not in err
