"""``llmobs demo`` (``tools.demo``): its flags, the objective it judges by unless the
environment declares one, what its clients saw, the summary it reads from the sidecar's own
series (as a dashboard would: the figures a newcomer trusts must be the sidecar's), the live
page kept up only when asked, and a whole short run."""

from __future__ import annotations

import argparse
import functools
import io
import re
from argparse import Namespace

import aiohttp
import pytest

from llmobs.config.settings import Settings
from llmobs.tools.demo import (
    DEMO_OBJECTIVE,
    Tally,
    _linger,
    _with_objective,
    add_demo_arguments,
    demo_flag,
    run_demo,
    summary,
)
from llmobs.tools.traffic import Result
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually
from tests.support.sim_streams import FAST, MESSAGES


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    return parser.parse_args(argv)


def test_the_flags_and_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse()
    assert (args.duration, args.concurrency, args.port, args.metrics_port) == (20.0, 24, 8080, 9464)
    assert (args.max_batch, args.stall_every, args.stall_ms, args.seed) == (16, 50, 100.0, 0)
    assert (args.host, args.linger, args.dialect) == ("127.0.0.1", None, "openai")
    assert _parse("--dialect", " Responses").dialect == "openai-responses"  # an earlier name
    assert _parse("--dialect", "mixed").dialect == "mixed"
    with pytest.raises(SystemExit):
        _parse("--dialect", "grpc")
    assert "invalid choice: 'grpc'" in capsys.readouterr().err


def test_a_port_the_sidecar_cannot_have_is_named_by_the_demos_flag() -> None:
    assert [demo_flag(f) for f in ("port", "metrics_port", "host", "metrics_host")] == [
        "--port", "--metrics-port", "--host", "--host"]  # fmt: skip
    assert demo_flag("upstream") == "upstream"  # not the demo's to set


def test_the_demo_judges_by_its_objective_unless_the_environment_declares_one() -> None:
    judged = _with_objective(Settings())
    assert (judged.slo_ttft, judged.slo_tpot, judged.slo_max_gap, judged.slo_target) == (
        1.0, 0.05, 0.25, 0.99)  # fmt: skip
    assert set(DEMO_OBJECTIVE) == {"slo_ttft", "slo_tpot", "slo_max_gap", "slo_target"}
    for own in (Settings(slo_duration=9.0), Settings(slo_no_stalls=True),
                Settings(slo_tpot=0.2)):  # fmt: skip
        assert _with_objective(own) == own


def test_the_tally_counts_what_the_clients_saw() -> None:
    tally = Tally()
    tally.add(Result(200, 0.25, (0.25, 0.5), 7, 0.6))
    tally.add(Result(200, None, (), 0, 0.1))  # answered, with no token
    tally.add(Result(500, None, (), 0, 0.1))
    tally.add(Result(200, 0.5, (0.5,), 3, 0.7, error="cut short"))
    assert (tally.ok, tally.failed, tally.tokens, tally.ttfts) == (2, 2, 7, [0.25])


async def _answered(url: str, count: int) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        for _ in range(count):
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()


def _recorded(side: SidecarHandle, count: int) -> bool:
    """Whether the sidecar has recorded ``count`` requests (its pending records made now)."""
    side.sidecar.flush_records()
    return side.value("llmobs_requests_total") == count


async def test_the_summary_reads_the_sidecars_own_series(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    """Three answered requests of four tokens each, over two seconds: one sidecar whose
    objective every one meets, one whose TTFT bound none can."""
    sim = await start_sim(**FAST, output_tokens_min=4, output_tokens_max=4)
    met = await start_sidecar(sim.url, slo_ttft=30.0, slo_target=0.9)
    missed = await start_sidecar(sim.url, slo_ttft=1e-6, slo_target=0.9)
    tally = Tally(ok=3, tokens=12, ttfts=[0.3, 0.1, 0.2])
    texts = []
    for side in (met, missed):
        await _answered(side.url, 3)
        await eventually(functools.partial(_recorded, side, 3))
        texts.append(summary(side.sidecar, tally, elapsed=2.0, peak_queue=1.0))
    good, bad = texts

    assert "  requests               3   (3 ok, 0 failed at client)\n" in good
    assert "  stalls                 0   (0.00 per request)\n" in good
    assert "  queue depth     peak   1   " in good
    assert "  throughput             6 output tokens/s\n" in good  # 12 tokens in 2 s
    assert "  objective       ttft <= 30s; 0.9 good over 28d\n" in good
    assert ("  goodput         100.0% of 3 requests good (target 90.0%): 1.5 good requests/s, "
            "6 good output tokens/s\n") in good  # fmt: skip
    assert "  misses          none\n" in good
    assert good.endswith("  client-side TTFT p50 200 ms (cross-check)\n")
    assert ("  goodput         0.0% of 3 requests good (target 90.0%): 0.0 good requests/s, "
            "0 good output tokens/s\n") in bad  # fmt: skip
    assert "  misses          ttft 3\n" in bad
    # why, as llmobs why adds it up: an engine that reports no phase leaves its time in other
    assert "  TTFT misses in  none   (the phase that took most of each)\n" in good
    assert "  stalls from     none\n" in good
    misses = re.search(r"  TTFT misses in  (.+)   \(the phase that took most of each\)", bad)
    assert misses is not None, bad
    assert set(re.findall(r"\d+% ([a-z ]+)", misses.group(1))) <= {"other", "before the engine"}
    ttft = re.search(r"TTFT      ms    p50 +(\d+)  p95 +(\d+)  p99 +(\d+)", good)
    assert ttft is not None and int(ttft.group(1)) < 1000, good


async def test_the_live_page_lingers_only_when_asked() -> None:
    out = io.StringIO()
    await _linger("http://127.0.0.1:1/ui/", 0.01, tty=False, out=out)
    assert out.getvalue() == (
        "The live page stays up 0 s more: http://127.0.0.1:1/ui/ (Ctrl-C to stop)\n"
        "  why it was slow, per model: llmobs why --metrics-url http://127.0.0.1:1/metrics\n"
    )
    quiet = io.StringIO()
    await _linger("http://127.0.0.1:1/ui/", None, tty=False, out=quiet)  # not a terminal
    await _linger("http://127.0.0.1:1/ui/", 0, tty=True, out=quiet)
    await _linger("", 5.0, tty=True, out=quiet)  # the page is off
    assert quiet.getvalue() == ""


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
    # why (issue 53): the engine reports its queue and prefill as vLLM's per-request metrics
    # do, so the first tokens' wait is told by phase, and the pauses are named as stalls' cause
    spent = re.search(r"TTFT spent in   (.+)", text)
    assert spent is not None and re.search(r"\d+% (queue|prefill)", spent.group(1)), text
    stalls = re.search(r"stalls from     (.+)", text)
    assert stalls is not None and "% engine pauses" in stalls.group(1), text
    assert "llmobs why --metrics-url http://127.0.0.1:" in text
