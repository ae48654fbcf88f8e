"""The command line as a user runs it: real processes, real ports, signals."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import sys
import time
from argparse import Namespace
from pathlib import Path

import aiohttp
import pytest

from llmobs.__main__ import main
from llmobs.config.options import shown_default
from llmobs.config.settings import OPTIONS, ConfigError, Settings
from llmobs.sim.config import SIM_OPTIONS
from llmobs.tools.demo import run_demo
from tests.support.prom import Prometheus, free_port, needs_prometheus
from tests.support.servers import SidecarFactory, SimFactory, eventually


def test_every_option_has_a_flag_and_variable_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    for opt in OPTIONS:
        assert opt.flag in text
        assert opt.env in text


def test_flags_override_environment_override_defaults() -> None:
    env = {"LLMOBS_PORT": "9000", "LLMOBS_READ_TIMEOUT": "7.5", "LLMOBS_MAX_BODY_BYTES": "2MiB"}
    s = Settings.from_sources(env, {"port": "9100"})
    assert (s.port, s.read_timeout, s.max_body_bytes, s.metrics_port) == (9100, 7.5, 2 << 20, 9464)


def _serve_args(argv: list[str]) -> Namespace:
    from llmobs.__main__ import _parser  # noqa: PLC0415
    from llmobs.config.options import bool_flags  # noqa: PLC0415
    from llmobs.sim.config import SIM_OPTIONS  # noqa: PLC0415

    return _parser().parse_args(bool_flags(["serve", *argv], (*OPTIONS, *SIM_OPTIONS)))


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [
        (["--token-spans"], {}, True),
        (["--no-token-spans"], {"LLMOBS_TOKEN_SPANS": "true"}, False),  # the flag wins
        ([], {"LLMOBS_TOKEN_SPANS": "yes"}, True),
        ([], {"LLMOBS_TOKEN_SPANS": "0"}, False),
        ([], {}, False),  # the default
        # the spelling earlier versions required, which scripts still pass
        (["--token-spans", "true"], {}, True),
        (["--token-spans", "off"], {}, False),
        (["--token-spans=1"], {}, True),
        (["--token-spans=no"], {}, False),
    ],
)
def test_boolean_flags_both_ways(argv: list[str], env: dict[str, str], want: bool) -> None:
    args = _serve_args(argv)
    settings = Settings.from_sources(env, {"token_spans": args.token_spans})
    assert settings.token_spans is want


def test_every_boolean_option_is_a_bare_flag_with_a_no_form() -> None:
    booleans = [o for o in OPTIONS if isinstance(o.default, bool)]
    assert len(booleans) >= 5
    for opt in booleans:
        name = opt.field
        assert getattr(_serve_args([opt.flag]), name) is True
        assert getattr(_serve_args(["--no-" + opt.flag.removeprefix("--")]), name) is False


def test_a_boolean_flag_refuses_a_value_that_is_not_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _serve_args(["--token-spans", "maybe"])
    assert "maybe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _serve_args(["--no-token-spans=true"])


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LLMOBS_PORT": "eighty"}, "LLMOBS_PORT"),
        ({"LLMOBS_UPSTREAM": "ftp://x"}, "LLMOBS_UPSTREAM"),
        ({"LLMOBS_READ_TIMEOUT": "-1"}, "LLMOBS_READ_TIMEOUT"),
        ({"LLMOBS_INSTRUMENT": "maybe"}, "LLMOBS_INSTRUMENT"),
        ({"LLMOBS_TOKEN_SPANS": "sometimes"}, "LLMOBS_TOKEN_SPANS"),
    ],
)
def test_bad_values_fail_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_sources(env)


def test_bad_configuration_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"], {"LLMOBS_METRICS_PORT": "99999"}) == 2
    assert "LLMOBS_METRICS_PORT" in capsys.readouterr().err


async def _wait_port(port: int, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        assert proc.returncode is None, "process exited early"
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise AssertionError(f"port {port} never opened")


async def test_serve_and_sim_processes_relay_and_stop_on_sigterm() -> None:
    sim_port, port, metrics_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "LLMOBS_UPSTREAM": f"http://127.0.0.1:{sim_port}",
        "LLMOBS_HOST": "127.0.0.1",
        "LLMOBS_METRICS_HOST": "127.0.0.1",
        "LLMOBS_METRICS_PORT": str(metrics_port),
    }
    sim = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", "sim", "--port", str(sim_port), "--decode-base", "0.001",
        env=env,
    )  # fmt: skip
    side = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", "serve", "--port", str(port), env=env,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_port(sim_port, sim)
        await _wait_port(port, side)
        await _wait_port(metrics_port, side)
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
        codes = [await asyncio.wait_for(proc.wait(), 10) for proc in (side, sim)]
    assert codes == [0, 0]
    assert side.stderr is not None
    logged = (await side.stderr.read()).decode()
    assert f"live page: http://127.0.0.1:{metrics_port}/ui/" in logged, logged


async def test_demo_runs_and_prints_a_summary() -> None:
    args = Namespace(duration=1.5, concurrency=4, host="127.0.0.1", port=0, metrics_port=0,
                     max_batch=2, stall_every=10, stall_ms=50.0, seed=1,
                     dialect="openai", linger=0.2)  # fmt: skip
    out = io.StringIO()
    assert await run_demo(args, {}, out) == 0
    text = out.getvalue()
    for needle in ("TTFT", "ITL", "smoothness", "stalls", "queue depth", "tokens/s", "/metrics"):
        assert needle in text
    # the live page's URL, and it stays up after the load for --linger seconds
    assert re.search(r"live page +http://127\.0\.0\.1:\d+/ui/", text), text
    assert re.search(r"stays up 0 s more: http://127\.0\.0\.1:\d+/ui/", text), text
    assert re.search(r"requests\s+[1-9]", text)
    # goodput against the demo's chat objective, every request judged
    assert "objective       ttft <= 1s, tpot <= 0.05s, max gap <= 0.25s" in text
    found = re.search(r"goodput\s+(\S+) of (\d+) requests good", text)
    assert found is not None, text
    requests = re.search(r"requests\s+(\d+)", text)
    assert requests is not None and found.group(2) == requests.group(1)


def test_the_default_install_is_the_fast_one() -> None:
    """``pip install .`` brings uvloop and orjson (where they have wheels), and ``serve``
    runs on uvloop by default (docs/benchmarks.md: 1.51-1.58 x nginx's CPU per chunk on
    asyncio, 1.34-1.40 x on uvloop)."""
    from importlib.metadata import requires  # noqa: PLC0415

    from llmobs.app import loop_factory  # noqa: PLC0415
    from llmobs.observe.dialects.base import JSON_PARSER  # noqa: PLC0415

    default = {re.split(r"[<>=!~;\[ ]", r)[0]: r for r in requires("llmobs") or []
               if "extra ==" not in r}  # fmt: skip
    assert {"uvloop", "orjson"} <= set(default)
    assert "win32" in default["uvloop"]  # a marker where it has no wheels
    assert JSON_PARSER == "orjson"
    factory = loop_factory("auto")
    assert factory is not None
    loop = factory()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()


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
    port, metrics_port = free_port(), free_port()
    loopback = ["--host", "127.0.0.1", "--metrics-host", "127.0.0.1"]
    first = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", "serve", *loopback, "--port", str(port),
        "--metrics-port", str(metrics_port), "--engine-scrape-interval", "0", env=_environ(),
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await _wait_port(port, first)
        await _wait_port(metrics_port, first)
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
        await asyncio.wait_for(first.wait(), 10)
    for (command, _, taken, how), (code, out, err) in zip(cases, results, strict=True):
        want = (
            f"llmobs {command}: 127.0.0.1:{taken} is already in use ({how}): stop the process "
            "listening there, or choose another port."
        )
        assert code == 2, (command, how, err)
        assert "Traceback" not in err, err
        assert err.strip().splitlines()[-1] == want, err
        assert "load:" not in out  # the demo stopped before any load


def test_the_same_port_for_proxy_and_metrics_is_a_configuration_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--port", "9000", "--metrics-port", "9000"], {}) == 2
    err = capsys.readouterr().err
    assert "--metrics-port / LLMOBS_METRICS_PORT: must differ from --port / LLMOBS_PORT" in err


async def test_slo_cannot_judge_exits_2_with_a_sentence(start_sidecar: SidecarFactory) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/metrics"
    code, out, err = await _llmobs("slo", "--metrics-url", nowhere)
    assert code == 2, err
    assert err == (
        f"llmobs slo: cannot judge: nothing is listening at {nowhere} (connection refused): "
        "check that the sidecar is up and that --metrics-url is its /metrics.\n"
    )
    assert out == ""

    # a sidecar that wants its metrics token, and has judged no request yet
    side = await start_sidecar(f"http://127.0.0.1:{free_port()}", metrics_token="s3cret")
    metrics = side.metrics_url + "/metrics"
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
    nowhere = f"http://127.0.0.1:{free_port()}"
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


# -- --help: defaults as a user would type them back ------------------------------------------


def _help(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """``llmobs COMMAND --help``, one line per option (argparse wraps to $COLUMNS)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "1000")
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_help_shows_defaults_as_a_user_would_type_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    serve = _help(capsys, "serve")
    assert "default 28d]" in serve and "2419200" not in serve  # --slo-window
    assert "default 16MiB]" in serve and "16777216" not in serve  # --max-body-bytes
    assert "default 1MiB]" in serve  # --max-line-bytes
    assert "accepts KiB/MiB/GiB suffixes" in serve
    assert "to the upstream (then 504) [env LLMOBS_CONNECT_TIMEOUT; default 10]" in serve
    assert "(then 502)" not in serve
    for command in ("serve", "sim", "demo", "slo", "bench"):
        text = _help(capsys, command)
        for raw in ("default None", "default ()", "default ]", "default True", "default False",
                    "default ;"):  # fmt: skip
            assert raw not in text, (command, raw)
        assert not re.search(r"(default |\[)\d+\.0\]", text), (command, text)
    bench = _help(capsys, "bench")
    assert "--saturation, --no-saturation" in bench
    assert "memory check; --no-saturation: only the paced cells [on]" in bench
    slo = _help(capsys, "slo")
    assert "Exit codes: 0 every objective met; 1 a label set below its target; 2 could not" in slo
    assert "[env LLMOBS_METRICS_TOKEN]" in slo


def test_every_default_shown_reads_back_as_the_default() -> None:
    for opt in (*OPTIONS, *SIM_OPTIONS):
        shown = shown_default(opt)
        if shown is None:
            assert opt.default in (None, "", ()), opt.flag
            continue
        assert opt.parse(shown) == opt.default, (opt.flag, shown)
