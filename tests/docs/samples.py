"""The sample outputs in README.md and docs/, produced by the commands they show.

A block marked ``<!--pytest.mark.docs(sample="NAME")-->`` holds the output of recipe NAME.
``python -m tests.docs.samples`` runs every recipe as the text describes it and writes the
output into its block; tests/docs/test_samples.py runs each recipe shortened and fails when
its output and the sample differ in shape (the same lines, the same fields, numbers aside).

- ``demo``: README's `llmobs demo` (its summary), 20 s of load as documented;
- ``why``: README's `llmobs why` against the demo's sidecar, while its live page stays up;
- ``slo``: docs/slo.md's `llmobs slo --metrics-url ...` after a few requests through a sidecar
  with an objective, one of them failed by the engine;
- ``span``: docs/tracing.md's stuttering stream: the simulated engine pausing 150 ms every 25
  decode steps, one 60-token chat with a client `traceparent`, its spans as exported.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from tests.docs.blocks import DOCUMENTS, ROOT, Block, blocks
from tests.support.ports import free_port

LLMOBS = [sys.executable, "-m", "llmobs"]


def sample_blocks() -> dict[str, Block]:
    """Every sample block, by its recipe's name."""
    return {
        b.options()["sample"]: b
        for doc in DOCUMENTS
        for b in blocks(doc)
        if "sample" in b.options()
    }


# --- demo ------------------------------------------------------------------------------------


def demo(short: bool) -> str:
    """README's first command's run: the summary `llmobs demo` prints after its load."""
    flags = ["--linger", "0"]
    if short:
        flags += ["--duration", "4", "--port", str(free_port()),
                  "--metrics-port", str(free_port())]  # fmt: skip
    out = subprocess.run([*LLMOBS, "demo", *flags], capture_output=True, text=True,
                         check=True, timeout=120).stdout  # fmt: skip
    return out[out.index("llmobs demo: what the sidecar measured") :]


def why(short: bool) -> str:
    """README's `llmobs why` after `llmobs demo` (20 s of load as documented), asked while the
    demo's page stays up."""
    metrics = free_port()
    flags = ["--linger", "60", "--port", str(free_port()), "--metrics-port", str(metrics)]
    if short:
        flags += ["--duration", "4"]
    url = f"http://127.0.0.1:{metrics}/metrics"
    demo = subprocess.Popen([*LLMOBS, "demo", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # the summary is printed: every request counted
            if "llmobs why --metrics-url" in line:
                break
        done = subprocess.run([*LLMOBS, "why", "--metrics-url", url], capture_output=True,
                              text=True, check=True, timeout=60)  # fmt: skip
    finally:
        demo.terminate()
        demo.communicate(timeout=30)
    return done.stdout.replace(url, "http://127.0.0.1:9464/metrics")


# --- slo -------------------------------------------------------------------------------------


@contextmanager
def servers(*commands: Sequence[str]) -> Iterator[None]:
    started = [subprocess.Popen(list(c), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for c in commands]  # fmt: skip
    try:
        yield
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            proc.wait(timeout=30)


def wait_for(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def chat(base: str, model: str, max_tokens: int, headers: dict[str, str] | None = None) -> None:
    """A streamed chat request as vLLM's clients send one (usage asked for); an HTTP error
    (the engine's injected 500s) is a failed request, not an exception."""
    body = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello " * 60}],
    }
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
    except urllib.error.HTTPError as error:
        error.read()


def slo(short: bool) -> str:
    """A sidecar with a chat objective in front of one engine slot: one request, then eight at
    once, so the last ones queue past the TTFT bound; the engine fails one of them."""
    engine, proxy, metrics = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{metrics}/metrics"
    with servers(
        [*LLMOBS, "sim", "--port", str(engine), "--max-batch", "1", "--error-rate", "0.15",
         "--seed", "1"],
        [*LLMOBS, "serve", "--upstream", f"http://127.0.0.1:{engine}", "--host", "127.0.0.1",
         "--port", str(proxy), "--metrics-port", str(metrics), "--slo-ttft", "500ms",
         "--slo-target", "0.9", "--engine-scrape-interval", "0"],
    ):  # fmt: skip
        wait_for(f"http://127.0.0.1:{metrics}/readyz")

        def ask(_: int) -> None:
            chat(f"http://127.0.0.1:{proxy}", "sim-llama-3-8b", 16)

        ask(0)  # the model's first success earns it its label (docs/metrics.md)
        with ThreadPoolExecutor(8) as clients:  # then eight clients at once
            list(clients.map(ask, range(8)))
        done = subprocess.run([*LLMOBS, "slo", "--metrics-url", url], capture_output=True,
                              text=True, check=False, timeout=60)  # fmt: skip
    if done.returncode not in (0, 1):
        raise RuntimeError(f"llmobs slo exited {done.returncode}: {done.stderr}")
    return done.stdout.replace(url, "http://127.0.0.1:9464/metrics")


# --- span ------------------------------------------------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def span(short: bool) -> str:
    """docs/tracing.md's request: its spans from an in-memory exporter, printed as a tree."""
    del short  # one request: already short
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    asyncio.run(_one_traced_request(exporter))
    return render(exporter.get_finished_spans())


async def _one_traced_request(exporter: Any) -> None:
    from aiohttp import web  # noqa: PLC0415

    from llmobs.app import Sidecar  # noqa: PLC0415
    from llmobs.config.settings import Settings  # noqa: PLC0415
    from llmobs.export.telemetry import build_telemetry  # noqa: PLC0415
    from llmobs.sim import SimSettings, build_sim_app  # noqa: PLC0415

    runner = web.AppRunner(build_sim_app(SimSettings(stall_every=25, stall_ms=150, seed=1)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    engine = f"http://127.0.0.1:{runner.addresses[0][1]}"
    telemetry = build_telemetry(span_exporter=exporter)
    sidecar = Sidecar(
        Settings(upstream=engine, host="127.0.0.1", port=0, metrics_host="127.0.0.1",
                 metrics_port=0, engine_scrape_interval=0, gpu_sample_interval=0,
                 provider_name="vllm"),  # what the collector would name the sim: vLLM-shaped
        telemetry,
    )  # fmt: skip
    await sidecar.start()
    try:
        base = f"http://127.0.0.1:{sidecar.port}"
        headers = {"traceparent": TRACEPARENT}
        await asyncio.to_thread(chat, base, "llama-3.1-8b", 60, headers)
    finally:
        await sidecar.stop()
        await runner.cleanup()  # the sidecar's stop has flushed its spans


def render(spans: Sequence[Any]) -> str:
    """The spans as docs/tracing.md prints them: the server span, its children, the events
    of the decode span (the first two, each stall and the one after it, the last)."""
    server = next(s for s in spans if s.parent is None or s.kind.name == "SERVER")
    t0: int = server.start_time

    def ms(ns: int) -> float:
        return (ns - t0) / 1e6

    lines = [
        f"trace {server.context.trace_id:032x}",
        f"{server.name}  [SERVER]  {ms(server.start_time):7.1f} ms -> "
        f"{ms(server.end_time):8.1f} ms",
    ]
    lines += _attributes(server.attributes, "    ")
    for child in sorted((s for s in spans if s is not server), key=lambda s: s.start_time):
        took = (child.end_time - child.start_time) / 1e6
        lines.append(f"  {child.name:<16} {ms(child.start_time):7.1f} ms -> "
                     f"{ms(child.end_time):8.1f} ms   ({took:.1f} ms)")  # fmt: skip
        lines += _attributes(child.attributes, "      ")
        lines += _events(child.events, ms)
    return "\n".join(lines) + "\n"


def _attributes(attributes: Any, indent: str) -> list[str]:
    def shown(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else repr(value)

    return [f"{indent}{key} = {shown(attributes[key])}" for key in sorted(attributes)]


def _events(all_events: Sequence[Any], ms: Callable[[int], float]) -> list[str]:
    causes = [e for e in all_events if e.name == "llmobs.stall"]  # one per stall, its cause
    events = [e for e in all_events if e.name != "llmobs.stall"]
    stalls = {i for i, e in enumerate(events) if e.attributes.get("llmobs.stall")}
    keep = {0, 1, len(events) - 1} | stalls | {i + 1 for i in stalls}
    lines, skipped = [], False
    for i, event in enumerate(events):
        if i not in keep:
            if not skipped:
                lines.append("      ...")
            skipped = True
            continue
        skipped = False
        a = event.attributes
        lines.append(
            f"      event {event.name}  at {ms(event.timestamp):7.1f} ms  index "
            f"{a['llmobs.token.index']:3d}  gap {a['llmobs.token.gap'] * 1000:6.1f} ms  tokens "
            f"{a['llmobs.token.count']}" + ("  <-- STALL" if a["llmobs.stall"] else "")
        )
    for event in causes:
        a = event.attributes
        lines.append(
            f"      event {event.name}  at {ms(event.timestamp):7.1f} ms  gap "
            f"{a['llmobs.stall.gap'] * 1000:6.1f} ms  cause {a['llmobs.stall.cause']}"
        )
    return lines


RECIPES: dict[str, Callable[[bool], str]] = {"demo": demo, "why": why, "slo": slo, "span": span}


def shape(text: str) -> list[str]:
    """A sample's lines with what varies between runs taken out: numbers, ids, the list of
    objectives missed, the shares of causes (their order, and whether any: `-`, `none`) and
    the events elided."""
    out = []
    for raw in text.splitlines():
        line = re.sub(r"\b[0-9a-f]{32}\b|chatcmpl-\w+", "ID", raw)
        line = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", line)
        line = re.sub(r"(\b[a-z_]+ N)(, [a-z_]+ N)+", r"\1", line)  # a list of misses: its first
        line = re.sub(r"<?N% [a-z][a-z ]*(, <?N% [a-z][a-z ]*)*|(?<=: )-$|(?<=  )none\b", "SHARES",
                      line)  # a list of shares, or none  # fmt: skip
        line = re.sub(r"\s+", " ", line).strip()
        if line and not line.startswith(("event ", "...")):
            out.append(line)
    return out


def regenerate(names: Sequence[str]) -> None:
    for name, block in sample_blocks().items():
        if names and name not in names:
            continue
        text = block.doc.read_text()
        fresh = RECIPES[name](False).rstrip("\n") + "\n"
        if block.code not in text:
            raise RuntimeError(f"{block.name}: the sample block was not found as read")
        block.doc.write_text(text.replace(block.code, fresh, 1))
        print(f"{block.name}: {name} regenerated")


if __name__ == "__main__":
    os.chdir(ROOT)
    regenerate(sys.argv[1:])
    sys.exit(0)
