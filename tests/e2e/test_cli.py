"""The command line as a user runs it: real processes, real ports, signals."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import sys
import time
from argparse import Namespace

import aiohttp
import pytest

from llmobs.__main__ import main
from llmobs.config import OPTIONS, ConfigError, Settings
from llmobs.demo import run_demo
from tests.support.prom import free_port


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
    from llmobs.options import bool_flags  # noqa: PLC0415
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
    from llmobs.formats.base import JSON_PARSER  # noqa: PLC0415

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
