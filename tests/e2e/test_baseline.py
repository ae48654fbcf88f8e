"""``llmobs slo --baseline``: a gate that does not flap. Five runs of the simulated engine make
the baseline; ten more runs of the same build pass it, every one; ten runs of a build whose
decode is 10 % slower (a sim setting) fail it, at least nine of them, naming the quantity and
by how much. Runs that cannot be compared (another workload, too few requests, a baseline
too thin) exit 2. The engine and each run's fresh sidecar are processes of their own, as in
CI; the clients run here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llmobs.__main__ import main
from llmobs.tools.capacity import drive
from llmobs.tools.capacity.workload import workload_of
from tests.support.ports import SERVE, SIM, running

# half the sim's default pace; every request 32 tokens long (the workload's max_tokens)
ENGINE: dict[str, Any] = {
    "max_batch": 16, "decode_base": 0.0075, "decode_per_seq": 0.00025,
    "prefill_base": 0.005, "prefill_per_token": 0.00005,
}  # fmt: skip
SLOWER = {**ENGINE, "decode_base": 0.0075 * 1.1, "decode_per_seq": 0.00025 * 1.1}
CLIENTS, REQUESTS = 4, 24
ENV = {**os.environ, "LLMOBS_HOST": "127.0.0.1", "LLMOBS_METRICS_HOST": "127.0.0.1"}


@contextlib.asynccontextmanager
async def engine(settings: dict[str, Any]) -> AsyncIterator[str]:
    """The sim in a process of its own, as in CI: its URL."""
    flags = [part for k, v in settings.items() for part in (f"--{k.replace('_', '-')}", f"{v:g}")]
    async with running("sim", "--port", "0", *flags, pattern=SIM, env=ENV) as (port,):
        yield f"http://127.0.0.1:{port}"


async def one_run(
    capsys: pytest.CaptureFixture[str], sim: str, *gate: str, workload: str = "fixed:64,32",
    requests: int = REQUESTS,
) -> tuple[int, dict[str, Any], str]:  # fmt: skip
    """A fresh sidecar (a process of its own: no hiccup of this one's heap in what it
    measures) in front of ``sim``, ``requests`` closed-loop requests through it (plus one
    warm-up per client, all let end), then ``llmobs slo --metrics-url ITS_METRICS GATE``."""
    async with running(
        "serve", "--port", "0", "--metrics-port", "0", "--upstream", sim,
        "--engine-scrape-interval", "0", pattern=SERVE, env=ENV,
    ) as (port, metrics_port):  # fmt: skip
        target = drive.Target(f"http://127.0.0.1:{port}", "sim-llama-3-8b")
        async with drive.session_for(CLIENTS, True) as session:
            samples = await drive.closed_loop(
                session, target, workload_of(workload), CLIENTS, requests, drain=True
            )
        assert all(s.ok for s in samples)
        return await slo(capsys, "--metrics-url", f"http://127.0.0.1:{metrics_port}/metrics",
                         *gate)  # fmt: skip


def runs_in(path: str) -> int:
    return len(json.loads(Path(path).read_text())["runs"])


async def slo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    """``llmobs slo ARGV --json`` off the event loop (the sidecar it reads runs on it)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["slo", *argv, "--json"], {})
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip().startswith("{") else {}, err


async def test_unchanged_runs_pass_and_a_slower_decode_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = str(tmp_path / "baseline.json")
    async with engine(ENGINE) as sim:
        for _ in range(5):
            code, _, err = await one_run(capsys, sim, "--record-baseline", base)
            assert code == 0, err
        assert runs_in(base) == 5
        unchanged = [await one_run(capsys, sim, "--baseline", base) for _ in range(10)]
    assert [code for code, _, _ in unchanged] == [0] * 10, [
        (i, q) for i, (_, doc, _) in enumerate(unchanged) for q in doc["quantities"]
        if q["regressed"]
    ]  # fmt: skip
    assert all(doc["outcome"] == "within" for _, doc, _ in unchanged)

    async with engine(SLOWER) as sim:
        slower = [await one_run(capsys, sim, "--baseline", base) for _ in range(10)]
    caught = [doc for code, doc, _ in slower if code == 1]
    tpot = [next(q for q in doc["quantities"] if q["quantity"] == "tpot_mean")
            for _, doc, _ in unchanged + slower]  # fmt: skip
    print(  # the figures, with pytest -rP (docs/benchmarks.md)
        f"TPOT mean's band: +{tpot[0]['band_upper'] / tpot[0]['baseline_mean'] - 1:.2%};",
        "unchanged:",
        [f"{q['change']:+.2%}" for q in tpot[:10]],
        "; 10 % slower decode:",
        [f"{q['change']:+.2%}" for q in tpot[10:]],
        "exit codes",
        [code for code, _, _ in slower],
    )
    assert len(caught) >= 9, [code for code, _, _ in slower]
    for doc in caught:
        assert doc["outcome"] == "regressed"
        named = {q["quantity"]: q["change"] for q in doc["quantities"] if q["regressed"]}
        assert 0.05 < named["tpot_mean"] < 0.2, named  # the decode step, 10 % slower
        assert all(change > 0 for change in named.values()), named


async def test_runs_that_cannot_be_compared_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = str(tmp_path / "baseline.json")
    other = tmp_path / "other.json"
    other.write_text('{"kind": "something else"}')
    async with engine(ENGINE) as sim:
        assert (await one_run(capsys, sim, "--record-baseline", base))[0] == 0
        code, doc, err = await one_run(capsys, sim, "--baseline", base)
        assert (code, doc["outcome"]) == (2, "not_comparable")
        assert "a noise band needs 3 at least" in err

        for _ in range(2):
            assert (await one_run(capsys, sim, "--record-baseline", base))[0] == 0
        code, _, err = await one_run(capsys, sim, "--baseline", base, workload="fixed:64,64")
        assert code == 2
        assert "another workload: 64.0 output tokens per request, the baseline's 32.0" in err
        code, _, err = await one_run(capsys, sim, "--record-baseline", base, workload="fixed:64,64")
        assert code == 2, "another workload is not added to the baseline"
        assert runs_in(base) == 3

        code, _, err = await one_run(capsys, sim, "--baseline", base, requests=8)
        assert code == 2
        assert "too few to compare" in err

        code, _, err = await one_run(capsys, sim, "--baseline", str(other))
        assert code == 2
        assert "cannot read the baseline" in err
