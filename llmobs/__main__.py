"""Command line: ``llmobs serve | sim | demo | bench | slo | capacity | why | tenant-key`` (also
``python -m llmobs ...``). Thin."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from llmobs import __version__
from llmobs.announce import configuration, unit_warnings
from llmobs.app import Sidecar, loop_factory, run_until, tune_process
from llmobs.bench import add_bench_arguments, run_bench_cli
from llmobs.config.logs import configure as configure_logging
from llmobs.config.options import bool_flags, source_of
from llmobs.config.otel import OtelSettings, otel_settings
from llmobs.config.settings import OPTIONS, ConfigError, Settings, add_arguments, settings_from_args
from llmobs.export.telemetry import build_telemetry
from llmobs.sim import add_sim_arguments, run_sim, sim_settings_from_args
from llmobs.sim.config import SIM_OPTIONS
from llmobs.tools.capacity.cli import (
    EXIT_CODES as CAPACITY_EXIT_CODES,
)
from llmobs.tools.capacity.cli import (
    add_capacity_arguments,
    run_capacity_cli,
)
from llmobs.tools.demo import add_demo_arguments, demo_flag, run_demo
from llmobs.tools.slo.cli import (
    EXIT_CODES,
    add_slo_arguments,
    add_source_arguments,
    run_slo_cli,
    run_why_cli,
)
from llmobs.tools.tenant_key import run_tenant_key
from llmobs.wire.listen import ListenError
from llmobs.wire.tls import TlsError


def _parse(given: list[str]) -> argparse.Namespace:
    """The command line parsed; a flag no command knows is told with the command's own usage
    (``llmobs serve --upstrem``: serve's), not the top level's, which argparse would give."""
    parser = _parser()
    args, unknown = parser.parse_known_args(bool_flags(given, (*OPTIONS, *SIM_OPTIONS)))
    if unknown:
        command: argparse.ArgumentParser = getattr(args, "command_parser", parser)
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmobs",
        description="OpenTelemetry observability sidecar for LLM inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"llmobs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the sidecar in front of an inference server",
        description="Relay every request to --upstream unchanged while timing every token; "
        "Prometheus metrics on --metrics-port. Every flag also reads an LLMOBS_* variable.",
    )
    add_arguments(serve)

    sim = sub.add_parser(
        "sim",
        help="run the simulated OpenAI-compatible inference engine",
        description="A simulated engine with a realistic timing model: prefill proportional "
        "to prompt tokens, decode slowing with the batch, a waiting queue, optional stalls. "
        "It speaks the OpenAI, Ollama, TGI, Anthropic, Responses and Triton APIs on their own "
        "paths.",
    )
    add_sim_arguments(sim)

    demo = sub.add_parser(
        "demo",
        help="simulated engine + sidecar + mixed load, then a latency summary",
        description="Start the simulated engine and the sidecar, drive a realistic mixed load "
        "through it and print TTFT, ITL, smoothness, stalls and queue depth.",
    )
    add_demo_arguments(demo)

    bench = sub.add_parser(
        "bench",
        help="measure the relay's added latency and cost against direct, nginx and LiteLLM",
        description="Drive N streaming clients through each target (direct to the simulated "
        "engine, nginx, llmobs, llmobs --no-instrument, LiteLLM) in interleaved rounds and "
        "report added TTFT, added per-chunk delay, jitter, chunks/s, CPU per chunk and per "
        "request, memory per stream and the gap a /metrics scrape adds (docs/benchmarks.md).",
    )
    add_bench_arguments(bench)

    slo = sub.add_parser(
        "slo",
        help="report attainment, goodput and misses per objective; exit 1 below target, 2 "
        "when it cannot judge",
        description="Read a sidecar's /metrics, or a Prometheus server over a range, and print "
        "per operation and model the requests judged against their service-level objectives, "
        "the share good against the target, good output tokens and the misses by objective. "
        "Exits 1 when a label set is below its target: a gate for CI after a load test.",
        epilog=EXIT_CODES,
    )
    add_slo_arguments(slo)

    capacity = sub.add_parser(
        "capacity",
        help="find the load a pod serves within its objectives (the knee) and what bends it",
        description="Drive an engine through the sidecar at rising load (concurrent clients "
        "or a request rate) with a workload of prompt and output lengths, find the largest "
        "load at which the objectives hold, to --precision, and say from the sidecar's own "
        "phases and causes what bends the curve there: the queue, prefill, preemptions, the "
        "KV cache, the decode step (docs/measure-first.md).",
        epilog=CAPACITY_EXIT_CODES,
    )
    add_capacity_arguments(capacity)

    why = sub.add_parser(
        "why",
        help="say why requests were slow: TTFT misses by phase, stalls by cause",
        description="Read a sidecar's /metrics, or a Prometheus server over a range, and print "
        "in all and per operation and model: the TTFT misses by the phase that took most of "
        "each, the gap and stall misses and the stalls by cause (prefill interference, "
        "preemptions, engine pauses, the client), and the share of TTFT in each phase "
        "(docs/metrics.md). Exits 2 when there is nothing to report from.",
    )
    add_source_arguments(why)

    sub.add_parser(
        "tenant-key",
        help="print the fingerprint of each API key read from the input, for --tenant-keys",
        description="Read API keys from the standard input, one a line, and print each one's "
        "fingerprint (sha256:...) for the --tenant-keys file: the key stays out of the shell's "
        "history and the process list. Exits 2 when no key was read.",
    )
    for command in sub.choices.values():  # whose usage a mistake in its flags is told with
        command.set_defaults(command_parser=command)
    return parser


async def _until_signalled(main: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, main.set)


def _browsable(host: str) -> str:
    """A host a browser on this machine can open: a wildcard address is this machine."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


async def _serve(settings: Settings, otel: OtelSettings) -> int:
    configure_logging(settings.log_level)
    tune_process()
    logging.getLogger("llmobs").debug("event loop: %s", type(asyncio.get_running_loop()).__module__)
    stop = asyncio.Event()
    await _until_signalled(stop)

    def announce(sidecar: Sidecar) -> None:
        logging.getLogger("llmobs").info(
            "llmobs %s: proxy on %s:%d%s -> %s; metrics on %s://%s:%d/metrics",
            __version__, settings.host, sidecar.port,
            " (TLS)" if settings.tls_cert_file else "", settings.upstream,
            "https" if settings.metrics_tls else "http", settings.metrics_host,
            sidecar.metrics_port,
        )  # fmt: skip
        proxy = sidecar.proxy
        for line in configuration(settings, proxy.objectives, proxy.tenancy, proxy.prices):
            logging.getLogger("llmobs").info("%s", line)
        for warning in unit_warnings(proxy.objectives.default):
            logging.getLogger("llmobs").warning("%s", warning)
        if sidecar.live is not None:
            logging.getLogger("llmobs").info(
                "live page: %s://%s:%d/ui/", "https" if settings.metrics_tls else "http",
                _browsable(settings.metrics_host),
                sidecar.metrics_port,
            )  # fmt: skip

    if otel.tracing:
        logging.getLogger("llmobs").info(
            "tracing: OTLP %s to %s, sampler %s", otel.traces_protocol, otel.traces_endpoint,
            otel.sampler,
        )  # fmt: skip
    await run_until(settings, build_telemetry(otel=otel), stop, announce)
    return 0


async def _sim(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    settings = sim_settings_from_args(args, environ)
    configure_logging("info")
    task = asyncio.ensure_future(run_sim(settings))
    stop = asyncio.Event()
    await _until_signalled(stop)
    await asyncio.wait([task, asyncio.ensure_future(stop.wait())], return_when="FIRST_COMPLETED")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return 0


def _flag_of(command: str) -> Callable[[str], str]:
    """How a user sets a field of ``command``'s settings: its flag, and its variable if any."""
    if command == "serve":
        return lambda field: source_of(field, OPTIONS)
    if command == "sim":
        return lambda field: source_of(field, SIM_OPTIONS)
    return demo_flag


# the commands that read or drive a running sidecar and print a report: (args, out, env) -> exit
_REPORTS: dict[str, Callable[[argparse.Namespace, TextIO, Mapping[str, str]], int]] = {
    "slo": run_slo_cli,
    "why": run_why_cli,
    "capacity": run_capacity_cli,
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of the ``llmobs`` command."""
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    env = os.environ if environ is None else environ
    try:
        if args.command == "serve":
            settings = settings_from_args(args, env)
            otel = otel_settings(env)
            with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
                return runner.run(_serve(settings, otel))
        if args.command == "sim":
            return asyncio.run(_sim(args, env))
        if args.command == "bench":
            return run_bench_cli(args)
        if args.command in _REPORTS:
            return _REPORTS[args.command](args, sys.stdout, env)
        if args.command == "tenant-key":
            return run_tenant_key(sys.stdin, sys.stdout, sys.stderr)
        tune_process()
        return asyncio.run(run_demo(args, env))
    except ConfigError as exc:
        print(f"llmobs: configuration error: {exc}", file=sys.stderr)
        return 2
    except (ListenError, TlsError) as exc:  # a port taken, a certificate file: one sentence
        print(f"llmobs {args.command}: {exc.sentence(_flag_of(args.command))}.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
