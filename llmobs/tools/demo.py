"""``llmobs demo``: the simulated engine, the sidecar in front of it, a mixed load, a summary.

The main job on a fresh machine: no GPU, no engine, no configuration. It shows in a minute
what the sidecar is for: the TTFT a user waits for grows with the queue, and a stream that
pauses every 50 tokens (the simulated engine's default here) has a fine mean ITL, a bad P99,
and a smoothness score that says so; how many requests met a chat objective (goodput); and
why the others missed it. The engine reports each request's queue and prefill times as vLLM
does with ``--enable-per-request-metrics``, so the misses are told by phase, not as ``other``;
the summary reads them, and the stalls' causes, as ``llmobs why`` does (``tools.slo.reasons``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from aiohttp import web

from llmobs.app import Sidecar
from llmobs.config.objectives import Objective, describe
from llmobs.config.otel import otel_settings
from llmobs.config.settings import Settings
from llmobs.export.metrics.query import buckets, quantile, total
from llmobs.export.telemetry import build_telemetry
from llmobs.sim import SimSettings, build_sim_app
from llmobs.sim.dialects import dialect_name
from llmobs.tools.amounts import amount
from llmobs.tools.slo import reasons
from llmobs.tools.slo.render import PHASE_WORDS, STALL_WORDS, shares
from llmobs.tools.traffic import DIALECTS, Result, Workload, run_load
from llmobs.wire.listen import ListenError


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load [20]")
    parser.add_argument("--concurrency", type=int, default=24, help="concurrent clients [24]")
    parser.add_argument("--host", default="127.0.0.1", help="sidecar address [127.0.0.1]")
    parser.add_argument("--port", type=int, default=8080, help="sidecar proxy port [8080]")
    parser.add_argument("--metrics-port", type=int, default=9464, help="metrics port [9464]")
    parser.add_argument("--max-batch", type=int, default=16, help="engine batch size [16]")
    parser.add_argument(
        "--stall-every", type=int, default=50, help="engine pause every N steps, 0 = off [50]"
    )
    parser.add_argument("--stall-ms", type=float, default=100.0, help="pause length [100]")
    parser.add_argument("--seed", type=int, default=0, help="workload and engine seed [0]")
    parser.add_argument(
        "--linger",
        type=float,
        default=None,
        help="seconds the live page stays up after the load, Ctrl-C ends it sooner "
        "[120 on a terminal, else 0]",
    )
    parser.add_argument(
        "--dialect",
        type=dialect_name,  # an earlier name too: responses
        choices=(*DIALECTS, "mixed"),
        default="openai",
        help="API the clients speak: OpenAI, Ollama native, TGI native, Anthropic Messages, "
        "OpenAI Responses, Triton generate, or each in turn [openai]",
    )


@dataclasses.dataclass
class Tally:
    """What the clients saw, for the progress line and the cross-check."""

    ok: int = 0
    failed: int = 0
    tokens: int = 0
    ttfts: list[float] = dataclasses.field(default_factory=list)

    def add(self, result: Result) -> None:
        if result.ok:
            self.ok += 1
            self.tokens += result.tokens
            if result.ttft is not None:
                self.ttfts.append(result.ttft)
        else:
            self.failed += 1


# The demo's flags that set the sidecar's settings (they read no environment variable).
DEMO_FLAGS = {"host": "--host", "metrics_host": "--host", "port": "--port",
              "metrics_port": "--metrics-port"}  # fmt: skip


def demo_flag(field: str) -> str:
    """The demo's flag that sets the sidecar's ``field`` (for a port it cannot listen on)."""
    return DEMO_FLAGS.get(field, field)


# The objective the demo judges by unless LLMOBS_SLO_* says otherwise: a chat service's, loose
# enough for the simulated engine's pauses (100 ms) and tight enough for its queue to show.
DEMO_OBJECTIVE = {"slo_ttft": 1.0, "slo_tpot": 0.05, "slo_max_gap": 0.25, "slo_target": 0.99}


def _with_objective(settings: Settings) -> Settings:
    """The demo's default objective, where the environment declares no bound of its own."""
    bounds = (settings.slo_ttft, settings.slo_tpot, settings.slo_max_gap, settings.slo_duration)
    if any(b is not None for b in bounds) or settings.slo_no_stalls or settings.slo_file:
        return settings
    return dataclasses.replace(settings, **DEMO_OBJECTIVE)  # type: ignore[arg-type]


def goodput_lines(sidecar: Sidecar, elapsed: float) -> list[str]:
    """Goodput against the objective, read from the sidecar's SLO series."""
    reg = sidecar.telemetry.registry
    objective = sidecar.proxy.recorder.objectives.default
    good = total(reg, "llmobs_slo_requests_total", verdict="good")
    judged = good + total(reg, "llmobs_slo_requests_total", verdict="bad")
    good_tokens = total(reg, "llmobs_slo_output_tokens_total", verdict="good")
    share = f"{good / judged:.1%}" if judged else "n/a"
    misses = ", ".join(
        f"{o.value} {n:.0f}"
        for o in Objective
        if (n := total(reg, "llmobs_slo_misses_total", objective=o.value))
    )
    return [
        f"  objective       {describe(objective)}",
        f"  goodput         {share} of {judged:.0f} requests good (target "
        f"{objective.target:.1%}): {good / elapsed:.1f} good requests/s, "
        f"{good_tokens / elapsed:.0f} good output tokens/s",
        f"  misses          {misses or 'none'}",
    ]


def why_lines(sidecar: Sidecar) -> list[str]:
    """Where the TTFT misses went and what the stalls came from, read from the sidecar's
    series and added up as ``llmobs why`` adds them (``tools.slo.reasons``)."""
    names = reasons.queries("").keys()
    samples = [(s.name, s.labels, s.value) for family in sidecar.telemetry.registry.collect()
               for s in family.samples if s.name in names]  # fmt: skip
    why = reasons.tally(samples).get(reasons.ALL, reasons.Why())
    misses, spent, stalls = (
        shares(why.ttft_misses, PHASE_WORDS), shares(why.ttft_seconds, PHASE_WORDS),
        shares(why.stalls, STALL_WORDS),
    )  # fmt: skip
    return [
        f"  TTFT misses in  {_none(misses)}   (the phase that took most of each)",
        f"  TTFT spent in   {_none(spent)}",
        f"  stalls from     {_none(stalls)}",
    ]


def _none(shown: str) -> str:
    return "none" if shown == "-" else shown


def cost_lines(sidecar: Sidecar) -> list[str]:
    """What the tokens cost, with a price file (``LLMOBS_PRICE_FILE``), in its currency."""
    prices = sidecar.proxy.prices
    if prices is None:
        return []
    reg, currency = sidecar.telemetry.registry, prices.currency
    cost = total(reg, "llmobs_cost_total")
    bad = total(reg, "llmobs_cost_total", verdict="bad")
    return [f"  cost            {amount(cost, currency)}   ({amount(bad, currency)} of it on bad "
            "requests)"]  # fmt: skip


def _ms(value: float | None) -> str:
    return "   n/a" if value is None else f"{value * 1000:6.0f}"


def summary(sidecar: Sidecar, tally: Tally, elapsed: float, peak_queue: float) -> str:
    """The at-a-glance report, read from the sidecar's own metrics (as a dashboard would)."""
    reg = sidecar.telemetry.registry
    ttft = buckets(reg, "gen_ai_server_time_to_first_token_seconds")
    itl = buckets(reg, "llmobs_inter_token_latency_seconds")
    smooth = buckets(reg, "llmobs_smoothness")
    itl_n = total(reg, "llmobs_inter_token_latency_seconds_count")
    itl_sum = total(reg, "llmobs_inter_token_latency_seconds_sum")
    stalls = total(reg, "llmobs_stalls_total")
    requests = total(reg, "llmobs_requests_total")
    out_tokens = total(reg, "llmobs_tokens_total", gen_ai_token_type="output")  # either convention
    lines = [
        "",
        "llmobs demo: what the sidecar measured",
        f"  requests        {requests:8.0f}   ({tally.ok} ok, {tally.failed} failed at client)",
        f"  TTFT      ms    p50 {_ms(quantile(0.5, ttft))}  p95 {_ms(quantile(0.95, ttft))}"
        f"  p99 {_ms(quantile(0.99, ttft))}",
        f"  ITL       ms    p50 {_ms(quantile(0.5, itl))}  p99 {_ms(quantile(0.99, itl))}"
        f"  mean {_ms(itl_sum / itl_n if itl_n else None)}",
        f"  smoothness      p50 {quantile(0.5, smooth) or 0:6.3f}  p10 "
        f"{quantile(0.1, smooth) or 0:6.3f}   (1 = perfectly steady)",
        f"  stalls          {stalls:8.0f}   ({stalls / max(requests, 1):.2f} per request)",
        f"  queue depth     peak {peak_queue:3.0f}   (requests waiting for their first token)",
        f"  throughput      {out_tokens / elapsed:8.0f} output tokens/s",
        *goodput_lines(sidecar, elapsed),
        *why_lines(sidecar),
        *cost_lines(sidecar),
    ]
    if tally.ttfts:
        ordered = sorted(tally.ttfts)
        p50 = ordered[len(ordered) // 2]
        lines.append(f"  client-side TTFT p50 {p50 * 1000:.0f} ms (cross-check)")
    return "\n".join(lines) + "\n"


def _page(host: str, sidecar: Sidecar, out: TextIO) -> str:
    """The live page's URL, printed ("" when it is off)."""
    if sidecar.live is None:
        return ""
    page = f"http://{host}:{sidecar.metrics_port}/ui/"
    print(f"  live page       {page}   (open it in a browser: the queue and the stutter)",
          file=out)  # fmt: skip
    return page


async def _linger(page: str, seconds: float | None, tty: bool, out: TextIO) -> None:
    """Keep the live page up after the load (on a terminal: two minutes) or until Ctrl-C."""
    linger = seconds if seconds is not None else (120.0 if tty else 0.0)
    if page and linger > 0:
        print(f"The live page stays up {linger:.0f} s more: {page} (Ctrl-C to stop)", file=out)
        print(f"  why it was slow, per model: llmobs why --metrics-url "
              f"{page.removesuffix('/ui/')}/metrics", file=out, flush=True)  # fmt: skip
        with contextlib.suppress(asyncio.CancelledError):  # Ctrl-C: the end asked for
            await asyncio.sleep(linger)


async def _start(sidecar: Sidecar, engine: web.AppRunner) -> None:
    """Start the sidecar; when it cannot listen (a port taken: another demo?), stop the
    engine too."""
    try:
        await sidecar.start()
    except ListenError:
        await engine.cleanup()
        raise


async def run_demo(
    args: argparse.Namespace, environ: Mapping[str, str], out: TextIO = sys.stdout
) -> int:
    """Run the whole demo; returns the exit code."""
    sim_settings = SimSettings(
        host="127.0.0.1", port=0, seed=args.seed, max_batch=args.max_batch,
        stall_every=args.stall_every, stall_ms=args.stall_ms, prefill_per_token=0.0001,
        per_request_metrics=True,  # as vLLM's --enable-per-request-metrics: TTFT in phases
    )  # fmt: skip
    sim_runner = web.AppRunner(build_sim_app(sim_settings), handler_cancellation=True)
    await sim_runner.setup()
    await web.TCPSite(sim_runner, "127.0.0.1", 0).start()
    sim_url = f"http://127.0.0.1:{sim_runner.addresses[0][1]}"
    settings = dataclasses.replace(
        _with_objective(Settings.from_sources(environ)),
        upstream=sim_url, host=args.host, port=args.port,
        metrics_host=args.host, metrics_port=args.metrics_port,
    )  # fmt: skip
    sidecar = Sidecar(settings, build_telemetry(otel=otel_settings(environ)))
    await _start(sidecar, sim_runner)
    proxy = f"http://{args.host}:{sidecar.port}"
    metrics = f"http://{args.host}:{sidecar.metrics_port}/metrics"
    print(f"llmobs demo: simulated engine at {sim_url} (batch {args.max_batch}, "
          f"pause {args.stall_ms:.0f} ms every {args.stall_every} steps; queue and prefill times "
          "reported as vLLM's per-request metrics)", file=out)  # fmt: skip
    print(f"  sidecar proxy   {proxy}   (clients talk here)", file=out)
    print(f"  sidecar metrics {metrics}   (try: curl {metrics})", file=out)
    page = _page(args.host, sidecar, out)
    print(f"  load: {args.concurrency} streaming clients ({args.dialect} API) for "
          f"{args.duration:.0f} s", file=out)  # fmt: skip
    tally = Tally()
    peak = 0.0
    start = time.perf_counter()
    load = asyncio.ensure_future(
        run_load(proxy, Workload(sim_settings.model, args.seed, dialect=args.dialect),
                 duration=args.duration,
                 concurrency=args.concurrency, on_result=tally.add)
    )  # fmt: skip
    tty = out.isatty()
    last_print = 0.0
    try:
        while not load.done():
            await asyncio.sleep(0.1)
            reg = sidecar.telemetry.registry
            queue = total(reg, "llmobs_prefill_queue_depth")
            peak = max(peak, queue)
            elapsed = time.perf_counter() - start
            if tty or elapsed - last_print >= 5:
                last_print = elapsed
                active = total(reg, "llmobs_requests_active")
                rate = tally.tokens / max(elapsed, 1e-9)
                clock = (f"{elapsed:4.0f}/{args.duration:.0f} s" if elapsed <= args.duration
                         else "draining")  # fmt: skip
                line = (f"  [{clock}] {tally.ok} done, "
                        f"{active:.0f} active, queue {queue:.0f}, {rate:.0f} tok/s"
                        f"  | metrics: {metrics}")  # fmt: skip
                print("\r" + line if tty else line, end="" if tty else "\n", file=out, flush=True)
        await load
        sidecar.flush_records()  # the last requests' records, before the summary reads them
        elapsed = time.perf_counter() - start
        if tty:
            print(file=out)
        print(summary(sidecar, tally, elapsed, peak), file=out)
        await _linger(page, args.linger, tty, out)
    finally:
        await sidecar.stop()
        await sim_runner.cleanup()
    return 0 if tally.ok else 1
