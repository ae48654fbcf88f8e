"""The command line's parsing and dispatch (``llmobs.__main__``): every command listed and each
with its --help, a mistake told by argparse (exit 2), the boolean flags both ways, defaults
shown as a user would type them, a bad configuration one sentence and exit 2 before anything
serves, and each command reaching its runner. In this process through ``main([...])``, and as
``python -m llmobs`` where the process is what is tested. Commands that serve (signals, ports
taken, ``llmobs slo`` against sidecars): tests/e2e/test_cli.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from argparse import Namespace

import pytest

from llmobs import __version__
from llmobs.__main__ import _browsable, _flag_of, _parser, main
from llmobs.config.options import bool_flags
from llmobs.config.settings import OPTIONS, Settings
from llmobs.sim.config import SIM_OPTIONS
from tests.support import ROOT
from tests.support.ports import port_of, refused_port

COMMANDS = ("serve", "sim", "demo", "bench", "slo", "capacity", "why", "tenant-key")


def _llmobs(*argv: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m llmobs ARGV`` run to its end, with no LLMOBS_* variable but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMOBS_")}
    return subprocess.run(
        [sys.executable, "-m", "llmobs", *argv], input=stdin, capture_output=True, text=True,
        env={**clean, **env}, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip


def _exits(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int | str | None, str, str]:
    """``main(argv)`` where argparse ends it: the exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def _help(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """``llmobs COMMAND --help``, one line per option (argparse wraps to $COLUMNS)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "1000")
        code, out, _ = _exits(capsys, command, "--help")
    assert code == 0
    return out


# --- the commands and their help ------------------------------------------------------------


def test_python_m_llmobs_lists_every_command() -> None:
    done = _llmobs("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: llmobs [-h] [--version] COMMAND ...\n")
    listed = re.findall(r"^    (\S+)(?: |$)", done.stdout, re.MULTILINE)
    assert tuple(listed) == COMMANDS, done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_its_help(capsys: pytest.CaptureFixture[str], command: str) -> None:
    text = _help(capsys, command)
    assert text.startswith(f"usage: llmobs {command} [-h]"), text
    assert "-h, --help" in text


def test_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exits(capsys, "--version") == (0, f"llmobs {__version__}\n", "")


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        ((), "the following arguments are required: COMMAND"),
        (("launch",), "argument COMMAND: invalid choice: 'launch'"),
        (("serve", "--bogus"), "unrecognized arguments: --bogus"),
        (("demo", "--duration", "soon"), "argument --duration: invalid float value: 'soon'"),
    ],
)
def test_a_mistake_is_told_by_argparse_with_exit_2(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], problem: str
) -> None:
    code, out, err = _exits(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("usage: llmobs") and f"error: {problem}" in err, err


@pytest.mark.parametrize("command", ["serve", "sim", "demo"])
def test_a_misspelled_flag_is_told_with_its_commands_usage(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, _, err = _exits(capsys, command, "--upstrem", "x")
    assert code == 2
    assert err.startswith(f"usage: llmobs {command} ")
    assert err.rstrip().endswith(f"llmobs {command}: error: unrecognized arguments: --upstrem x")


def test_every_option_has_a_flag_and_variable_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "serve")
    for opt in OPTIONS:
        assert opt.flag in text
        assert opt.env in text


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


# --- boolean flags ----------------------------------------------------------------------------


def _serve_args(argv: list[str]) -> Namespace:
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


# --- a bad configuration: one sentence, exit 2, nothing served --------------------------------


def test_bad_configuration_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"], {"LLMOBS_METRICS_PORT": "99999"}) == 2
    assert "LLMOBS_METRICS_PORT" in capsys.readouterr().err


def test_the_same_port_for_proxy_and_metrics_is_a_configuration_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--port", "9000", "--metrics-port", "9000"], {}) == 2
    err = capsys.readouterr().err
    assert "--metrics-port / LLMOBS_METRICS_PORT: must differ from --port / LLMOBS_PORT" in err


def test_a_bad_sim_setting_exits_2_naming_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The sim's flags are read by its settings, not by argparse: one sentence, exit 2."""
    assert main(["sim", "--max-batch", "0"], {}) == 2
    assert capsys.readouterr() == (
        "", "llmobs: configuration error: --max-batch / LLMOBS_SIM_MAX_BATCH: must be >= 1, "
        "got 0\n",
    )  # fmt: skip
    assert main(["sim", "--max-batch", "many"], {}) == 2
    assert capsys.readouterr().err == (
        "llmobs: configuration error: --max-batch: 'many' is not a whole number, e.g. 8080\n"
    )


def test_a_bad_environment_stops_the_demo_before_its_load() -> None:
    done = _llmobs("demo", "--port", "0", "--metrics-port", "0", LLMOBS_MAX_BODY_BYTES="lots")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("llmobs: configuration error: LLMOBS_MAX_BODY_BYTES: ")
    assert "load:" not in done.stdout


# --- dispatch: each command reaches its runner ------------------------------------------------


def test_why_that_cannot_reach_its_source_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """(``llmobs slo``'s, through the process: tests/e2e/test_cli.py)"""
    with refused_port() as closed:
        metrics = f"http://127.0.0.1:{port_of(closed)}/metrics"
        assert main(["why", "--metrics-url", metrics], {}) == 2
    assert capsys.readouterr() == ("", (
        f"llmobs why: nothing is listening at {metrics} (connection refused): check that the "
        "sidecar is up and that --metrics-url is its /metrics.\n"))  # fmt: skip


def test_bench_refuses_a_mistake_before_a_run() -> None:
    with pytest.raises(SystemExit, match=r"^llmobs bench: --concurrency and --rounds must be"):
        main(["bench", "--rounds", "0"])


def test_tenant_key_reads_its_keys_from_standard_input() -> None:
    done = _llmobs("tenant-key", stdin="abc\n")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
    )


def test_tenant_key_with_no_key_says_how_to_give_one() -> None:
    done = _llmobs("tenant-key", stdin="")  # as `llmobs tenant-key < /dev/null`
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("llmobs tenant-key: no key on standard input; give one a line")


def test_a_wildcard_address_is_browsed_on_this_machine() -> None:
    assert [_browsable(h) for h in ("0.0.0.0", "", "::", "10.1.2.3", "localhost")] == [
        "127.0.0.1", "127.0.0.1", "127.0.0.1", "10.1.2.3", "localhost"]  # fmt: skip


def test_a_port_taken_is_named_as_the_command_sets_it() -> None:
    assert _flag_of("serve")("port") == "--port / LLMOBS_PORT"
    assert _flag_of("serve")("metrics_port") == "--metrics-port / LLMOBS_METRICS_PORT"
    assert _flag_of("sim")("port") == "--port / LLMOBS_SIM_PORT"
    assert _flag_of("demo")("metrics_port") == "--metrics-port"  # the demo reads no variable


@pytest.mark.parametrize("command", ["serve", "sim"])
def test_a_certificate_file_that_will_not_load_is_one_sentence(
    command: str, tmp_path: os.PathLike[str]
) -> None:
    missing = os.path.join(tmp_path, "cert.pem")
    done = _llmobs(command, "--port", "0", "--tls-cert-file", missing, "--tls-key-file", missing)
    prefix = "LLMOBS_SIM_" if command == "sim" else "LLMOBS_"
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.endswith(
        f"llmobs {command}: --tls-cert-file / {prefix}TLS_CERT_FILE: {missing} does not "
        "exist; check the path.\n"
    )
    assert "Traceback" not in done.stderr
