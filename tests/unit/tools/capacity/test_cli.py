"""``llmobs capacity``'s flags: what it refuses before any load, and why (exit 2)."""

from __future__ import annotations

import pytest

from llmobs.__main__ import main
from tests.support.ports import port_of, refused_port


def test_no_objective_is_a_configuration_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--url", "http://127.0.0.1:1"], {}) == 2
    assert "give at least one objective: --ttft, --tpot or --max-gap" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--ttft", "soon"], "--ttft: 'soon' is not a duration"),
        (["--ttft", "0"], "--ttft: must be above 0"),
        (["--ttft", "1s", "--quantile", "1"], "--quantile: must be above 0 and below 1"),
        (["--ttft", "1s", "--by", "tokens"], "--by: invalid choice"),
    ],
)
def test_a_bad_flag_says_which(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["capacity", "--url", "http://127.0.0.1:1", *argv], {})
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


def test_a_workload_that_cannot_be_read(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", "--url", "http://127.0.0.1:1", "--ttft", "1s", "--workload", "fixed:1"]
    assert main(argv, {}) == 2
    assert "--workload: fixed:PROMPT,OUTPUT" in capsys.readouterr().err


def test_nothing_listening_is_exit_2_before_any_load(capsys: pytest.CaptureFixture[str]) -> None:
    with refused_port() as sock:
        url = f"http://127.0.0.1:{port_of(sock)}"
        assert main(["capacity", "--url", url, "--ttft", "1s"], {}) == 2
    err = capsys.readouterr().err
    assert f"--url: nothing answers at {url}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--at", "0.5"], "--at: concurrency is whole clients, 1 or more: 0.5"),
        (["--start", "2.5"], "--start: concurrency is whole clients"),
        (["--start", "8", "--max", "4"], "--max (4) is below --start (8)"),
        (["--out", "/no/such/folder/c"], "--out: no folder /no/such/folder"),
    ],
)
def test_loads_out_of_range_are_refused_before_any_load(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    assert main(["capacity", "--url", "http://127.0.0.1:1", "--ttft", "1s", *argv], {}) == 2
    assert said in capsys.readouterr().err


def test_requests_are_whole_and_one_at_least(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["capacity", "--url", "http://127.0.0.1:1", "--ttft", "1s", "--requests", "0"], {})
    assert "--requests: must be a whole number, 1 or more" in capsys.readouterr().err
