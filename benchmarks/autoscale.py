"""Autoscaling on each signal, proven in simulation: which one keeps users within their
objective, and at what cost in replicas.

A small fleet of pods, each a simulated engine (``llmobs sim``, a KV cache of its own) with
its sidecar (``llmobs serve``, TTFT and TPOT objectives), behind a least-loaded balancer (this
driver: each request to the ready pod with the fewest in flight). A real Prometheus scrapes
the ready pods (file-based discovery, as a PodMonitor scrapes Ready pods) and evaluates the
shipped recording rules, their saturation window compressed with the day. A controller applies
the HPA algorithm to one signal read from Prometheus: desired = ceil(ready pods x value /
target) (a per-pod average, HPA's ``Value``) or ceil(value / target) (a total,
``AverageValue``), nothing within the 10 % tolerance, up by its scale-up policies (4 pods or
100 % a period, or ``--scale-up``), the highest recommendation of the scale-down window, none
while the signal is absent (missing data never scales down), and a pod ready only after its
start-up delay (a model's load). The traffic is a day compressed into minutes, seeded: a
night, a morning ramp, a burst, a plateau, a lull, a wave of long prompts, an evening.

Each signal runs the same day on a fresh fleet, one after the other. Per signal: the share of
requests that met the objective (measured by the client: TTFT and TPOT against the bounds),
the replica-seconds used, the scale-ups that came late (users already missing the objective
in the window before) and the scale-downs that hurt (users missing it in the window after).

    python benchmarks/autoscale.py                       # every signal, one after the other
    python benchmarks/autoscale.py --signals llmobs-saturation,kv-cache --json out.json
    python benchmarks/autoscale.py --speed 0.5           # the day in half the time (a test)
    python benchmarks/autoscale.py --target kv-cache=0.3,0.45 --target waiting=0.5

Results, machine and method: docs/benchmarks.md, "Autoscaling on each signal".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.ports import free_port  # noqa: E402
from tests.support.prom import Prometheus  # noqa: E402

# The objective the users hold the fleet to, and the pods' engine (the sim's defaults, a KV
# cache of 16 requests of 1200 tokens, so that its usage means something)
TTFT_S, TPOT_S = 1.0, 0.05
ENGINE = ["--max-batch", "16", "--kv-capacity", "19200", "--output-tokens-min", "1",
          "--output-tokens-max", "4096"]  # fmt: skip
JOB, ENGINE_JOB = "llmobs", "engine"


@dataclass(frozen=True)
class Signal:
    """A signal an autoscaler reads: its query, its target, and whether the query gives a
    per-pod average (HPA's ``Value``: desired = ceil(ready pods x value / target)) or a total
    (``AverageValue``: desired = ceil(value / target))."""

    name: str
    query: str
    target: float
    total: bool = False


def signals(window: str) -> tuple[Signal, ...]:
    """The signals compared, their windows ``window`` (the rules' compressed minute), each at
    the best target of the sweep in docs/benchmarks.md."""
    return (
        Signal("llmobs-saturation", f'namespace_job:llmobs_saturation:ratio{{job="{JOB}"}}', 0.6),
        Signal("llmobs-backlog", 'namespace_job_role:llmobs_prefill_backlog_seconds:sum'
               f'{{job="{JOB}",pd_role="whole"}}', 0.5, total=True),
        Signal("kv-cache", f'avg(vllm:kv_cache_usage_perc{{job="{ENGINE_JOB}"}})', 0.2),
        Signal("waiting", f'sum(vllm:num_requests_waiting{{job="{ENGINE_JOB}"}})', 1.0,
               total=True),
        Signal("gpu-utilisation",
               f'avg(rate(sim:busy_seconds_total{{job="{ENGINE_JOB}"}}[{window}]))', 0.9),
    )  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """A stretch of the day: arrivals per second from ``start`` to ``end`` (linear), prompts
    of ``prompt`` tokens (a range), for ``seconds`` of the day at speed 1."""

    name: str
    seconds: float
    start: float
    end: float
    prompt: tuple[int, int] = (200, 1000)


DAY = (
    Phase("night", 40, 1, 1),
    Phase("ramp", 100, 1, 10),
    Phase("morning", 60, 10, 10),
    Phase("burst", 30, 16, 16),
    Phase("noon", 60, 10, 10),
    Phase("lull", 40, 2, 2),
    Phase("long prompts", 50, 3, 3, (3000, 4000)),
    Phase("evening", 40, 1, 1),
)
OUTPUT = (32, 128)  # output tokens, uniform


@dataclass(frozen=True)
class Control:
    """The HPA's knobs, compressed with the day (``speed``: 1 is the scale below)."""

    period: float = 3.0  # HPA's 15 s sync
    tolerance: float = 0.1
    down_window: float = 60.0  # its 300 s scale-down stabilisation
    startup: float = 15.0  # a pod's start to ready (a model's load)
    min_replicas: int = 1
    max_replicas: int = 8
    window: str = "15s"  # the rules' minute
    # its scale-up policies (type, value, period), the largest allowed wins: its default, 4
    # pods or 100 % a 15 s period
    up_policies: tuple[tuple[str, float, float], ...] = (("Pods", 4, 3.0), ("Percent", 100, 3.0))


@dataclass
class Outcome:
    """One request as its client saw it."""

    sent: float
    ended: float
    good: bool


@dataclass
class Report:
    signal: str
    target: float
    requests: int = 0
    good: int = 0
    replica_seconds: float = 0.0
    scale_ups: int = 0
    late_scale_ups: int = 0
    scale_downs: int = 0
    hurtful_scale_downs: int = 0
    max_replicas: int = 0
    held: int = 0  # decisions skipped: the signal absent
    missed: dict[str, int] = field(default_factory=dict)  # by phase, of the requests sent in it
    replicas: list[tuple[float, int]] = field(default_factory=list)

    @property
    def within(self) -> float:
        return self.good / self.requests if self.requests else 0.0


class Pod:
    """One pod: a sim and its sidecar, two processes; ready after the start-up delay."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.engine_port, self.port, self.metrics_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.work = work
        self.procs: list[asyncio.subprocess.Process] = []
        self.in_flight = 0
        self.ready = False
        self.draining = False

    async def start(self) -> None:
        log = (self.work / f"{self.name}.log").open("ab")
        sim = ["-m", "llmobs", "sim", "--port", str(self.engine_port), *ENGINE]
        serve = [
            "-m", "llmobs", "serve", "--upstream", f"http://127.0.0.1:{self.engine_port}",
            "--host", "127.0.0.1", "--port", str(self.port), "--metrics-host", "127.0.0.1",
            "--metrics-port", str(self.metrics_port), "--slo-ttft", f"{TTFT_S}s",
            "--slo-tpot", f"{TPOT_S}s", "--gpu-sample-interval", "0",
            "--engine-scrape-interval", "0", "--log-level", "warning",
        ]  # fmt: skip
        for args in (sim, serve):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *args, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                cwd=ROOT,
            )  # fmt: skip
            self.procs.append(proc)

    async def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


class Fleet:
    """The pods, the balancer's choice among them, and the targets Prometheus discovers."""

    def __init__(self, work: Path, sd_file: Path) -> None:
        self.work = work
        self.sd_file = sd_file
        self.pods: list[Pod] = []
        self._tasks: set[asyncio.Future[None]] = set()
        self.count = 0
        self.replica_seconds = 0.0
        self._since = time.monotonic()
        self.write_targets()

    def _account(self) -> None:
        now = time.monotonic()
        self.replica_seconds += len(self.pods) * (now - self._since)
        self._since = now

    def write_targets(self) -> None:
        """The ready pods' sidecars and engines, as a PodMonitor would scrape them."""
        groups = []
        for pod in self.pods:
            if pod.ready and not pod.draining:
                groups.append({"targets": [f"127.0.0.1:{pod.metrics_port}"],
                               "labels": {"job": JOB, "pod": pod.name}})  # fmt: skip
                groups.append({"targets": [f"127.0.0.1:{pod.engine_port}"],
                               "labels": {"job": ENGINE_JOB, "pod": pod.name}})  # fmt: skip
        tmp = self.sd_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.sd_file)

    async def add(self, startup: float) -> None:
        self._account()
        pod = Pod(f"pod-{self.count}", self.work)
        self.count += 1
        self.pods.append(pod)
        await pod.start()
        self._tasks.add(asyncio.ensure_future(self._ready(pod, startup)))

    async def _ready(self, pod: Pod, startup: float) -> None:
        """Ready after the start-up delay, once its sidecar says so (its engine answers)."""
        await asyncio.sleep(startup)
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"http://127.0.0.1:{pod.metrics_port}/readyz") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.1)
        if pod in self.pods and not pod.draining:
            pod.ready = True
            self.write_targets()

    async def remove(self) -> None:
        """The least busy pod leaves: out of the balancer and the targets at once, its
        streams drained, then stopped (as a terminating pod with a grace period)."""
        live = [p for p in self.pods if not p.draining]
        pod = min(live, key=lambda p: (p.ready, p.in_flight))  # a starting one first
        pod.draining = True
        self.write_targets()
        for _ in range(600):  # (a minute's grace at most)
            if not pod.in_flight:
                break
            await asyncio.sleep(0.1)
        self._account()
        self.pods.remove(pod)
        await pod.stop()

    def leaving(self, removal: Coroutine[Any, Any, None]) -> None:
        """A pod's removal, run on its own (its streams drain meanwhile)."""
        task = asyncio.ensure_future(removal)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def replicas(self) -> int:
        return sum(1 for p in self.pods if not p.draining)

    @property
    def ready(self) -> int:
        return sum(1 for p in self.pods if p.ready and not p.draining)

    def choose(self) -> Pod | None:
        ready = [p for p in self.pods if p.ready and not p.draining]
        return min(ready, key=lambda p: p.in_flight) if ready else None

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._account()
        await asyncio.gather(*(p.stop() for p in self.pods))
        self.pods.clear()


async def one_request(
    session: aiohttp.ClientSession, fleet: Fleet, prompt: int, output: int, start: float
) -> Outcome:
    """A streaming chat request through the least-loaded ready pod; good if its TTFT and
    TPOT are within the objective (a request no pod could take is bad)."""
    sent = time.monotonic() - start
    pod = fleet.choose()
    if pod is None:
        return Outcome(sent, sent, False)
    body = {"model": "m", "stream": True, "max_tokens": output, "ignore_eos": True,
            "messages": [{"role": "user", "content": "abcd" * prompt}]}  # fmt: skip
    times: list[float] = []
    pod.in_flight += 1
    t0 = time.monotonic()
    try:
        async with session.post(pod.url + "/v1/chat/completions", json=body) as r:
            ok = r.status == 200
            async for line in r.content:
                if line.startswith(b"data: {") and b'"content"' in line:
                    times.append(time.monotonic() - t0)
    except (aiohttp.ClientError, OSError):
        ok = False
    finally:
        pod.in_flight -= 1
    ended = time.monotonic() - start
    if not ok or not times:
        return Outcome(sent, ended, False)
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    return Outcome(sent, ended, times[0] <= TTFT_S and tpot <= TPOT_S)


async def traffic(fleet: Fleet, speed: float, seed: int, outcomes: list[Outcome]) -> None:
    """The day's arrivals (Poisson, its rate following the phases), each request on its own
    task; returns when every request ended."""
    rng = random.Random(seed)
    start = time.monotonic()
    tasks: list[asyncio.Task[Outcome]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        elapsed = 0.0
        for phase in DAY:
            length = phase.seconds * speed
            t = 0.0
            while True:
                rate = phase.start + (phase.end - phase.start) * t / length
                t += rng.expovariate(rate)
                if t >= length:
                    break
                delay = start + elapsed + t - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                prompt, output = rng.randint(*phase.prompt), rng.randint(*OUTPUT)
                tasks.append(asyncio.ensure_future(
                    one_request(session, fleet, prompt, output, start)))  # fmt: skip
            elapsed += length
        outcomes.extend(await asyncio.gather(*tasks))


async def value(prom: Prometheus, query: str) -> float | None:
    """The signal now (None: absent, or not a number)."""
    try:
        found = await prom.query(query)
    except (AssertionError, aiohttp.ClientError):
        return None
    values = [v for _, v in found if math.isfinite(v)]
    return values[0] if len(values) == 1 else None


def recommend(signal: Signal, current: int, ready: int, value: float, control: Control) -> int:
    """The HPA algorithm's recommendation for ``value`` of ``signal`` with ``current`` pods,
    ``ready`` of them ready: its replica calculator's, ceil(value / target x ready pods) for a
    ``Value`` (the pods still starting are not counted), ceil(value / target) for an
    ``AverageValue``, the current count within the tolerance."""
    if signal.total:
        if abs(value / (signal.target * max(current, 1)) - 1) <= control.tolerance:
            return current
        desired = math.ceil(value / signal.target - 1e-9)
    else:
        if abs(value / signal.target - 1) <= control.tolerance:
            return current
        desired = math.ceil(value / signal.target * ready - 1e-9)
    return max(control.min_replicas, min(control.max_replicas, desired))


def stabilised(window: Sequence[int], current: int, up_limit: int) -> int:
    """HPA's behaviour over the recommendations of the scale-down window (the latest last):
    up at once to the latest but no further than ``up_limit``, down only to the window's
    highest."""
    latest = window[-1]
    if latest > current:
        return max(current, min(latest, up_limit))
    return min(current, max(window))


def scale_up_limit(current: int, ups: Sequence[tuple[float, int]], now: float,
                   policies: Sequence[tuple[str, float, float]]) -> int:  # fmt: skip
    """The most pods HPA's scale-up policies allow now (``selectPolicy: Max``): each counts
    the pods added (``ups``: time, pods) within its period back from ``now`` and allows its
    value more than the count at the period's start, in pods or per cent."""
    limits = []
    for kind, value, period in policies:
        start = current - sum(n for t, n in ups if t > now - period)
        if kind == "Pods":
            limits.append(start + int(value))
        else:
            limits.append(math.ceil(start * (1 + value / 100)))
    return max(limits)


async def controller(
    signal: Signal, fleet: Fleet, prom: Prometheus, control: Control, report: Report,
    decisions: list[tuple[float, int, int]], stop: asyncio.Event,
) -> None:  # fmt: skip
    """Every period: the signal, the recommendation, the scale-down window's highest; a
    decision logged as (time, from, to)."""
    history: list[tuple[float, int]] = []
    ups: list[tuple[float, int]] = []
    start = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(control.period)
        now = time.monotonic() - start
        current = fleet.replicas
        report.replicas.append((round(now, 1), current))
        found = await value(prom, signal.query)
        if found is None:
            report.held += 1
            continue
        history.append((now, recommend(signal, current, fleet.ready, found, control)))
        history = [(t, d) for t, d in history if t >= now - control.down_window]
        limit = scale_up_limit(current, ups, now, control.up_policies)
        desired = stabilised([d for _, d in history], current, limit)
        if desired > current:
            decisions.append((now, current, desired))
            ups.append((now, desired - current))
            await asyncio.gather(*(fleet.add(control.startup) for _ in range(desired - current)))
        elif desired < current:
            decisions.append((now, current, desired))
            for _ in range(current - desired):
                fleet.leaving(fleet.remove())


def judge(report: Report, outcomes: Sequence[Outcome], decisions: Sequence[tuple[float, int, int]],
          window: float) -> None:  # fmt: skip
    """The scale-ups that came after users missed (1 % or more of the requests ending in the
    window before), the scale-downs after which they did (1 % of those sent in the window
    after)."""

    def bad_share(chosen: list[Outcome]) -> float:
        return sum(not o.good for o in chosen) / len(chosen) if chosen else 0.0

    for t, before, after in decisions:
        if after > before:
            report.scale_ups += 1
            if bad_share([o for o in outcomes if t - window <= o.ended <= t]) >= 0.01:
                report.late_scale_ups += 1
        else:
            report.scale_downs += 1
            if bad_share([o for o in outcomes if t <= o.sent <= t + window]) >= 0.01:
                report.hurtful_scale_downs += 1


def missed_by_phase(outcomes: Sequence[Outcome], speed: float) -> dict[str, int]:
    """The requests that missed the objective, by the phase of the day they were sent in."""
    missed = dict.fromkeys((p.name for p in DAY), 0)
    ends, elapsed = [], 0.0
    for phase in DAY:
        elapsed += phase.seconds * speed
        ends.append((elapsed, phase.name))
    for outcome in outcomes:
        if not outcome.good:
            name = next((n for end, n in ends if outcome.sent < end), DAY[-1].name)
            missed[name] += 1
    return missed


async def run_signal(signal: Signal, control: Control, speed: float, seed: int,
                     rules: str) -> Report:  # fmt: skip
    """One day on a fresh fleet under ``signal``."""
    report = Report(signal.name, signal.target)
    with tempfile.TemporaryDirectory(prefix=f"autoscale-{signal.name}-") as tmp:
        work = Path(tmp)
        sd_file = work / "targets.json"
        fleet = Fleet(work, sd_file)
        prom = Prometheus(work, [], {"rules.yml": rules})
        (work / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": "fleet", "file_sd_configs": [
                {"files": [str(sd_file)], "refresh_interval": "1s"}]}],
        }))  # fmt: skip
        async with prom:
            for _ in range(control.min_replicas):
                await fleet.add(control.startup)
            await asyncio.sleep(control.startup + 5)  # ready, and scraped a few times
            outcomes: list[Outcome] = []
            decisions: list[tuple[float, int, int]] = []
            stop = asyncio.Event()
            ctl = asyncio.ensure_future(
                controller(signal, fleet, prom, control, report, decisions, stop)
            )
            await traffic(fleet, speed, seed, outcomes)  # (its clock starts with the controller's)
            stop.set()
            await ctl
            await fleet.close()
        report.requests = len(outcomes)
        report.good = sum(o.good for o in outcomes)
        report.replica_seconds = round(fleet.replica_seconds, 1)
        report.max_replicas = max((n for _, n in report.replicas), default=0)
        judge(report, outcomes, decisions, control.down_window / 2)
        report.missed = missed_by_phase(outcomes, speed)
    return report


def load_rules(window: str) -> str:
    """The shipped recording rules, their saturation window compressed to ``window``."""
    path = ROOT / "deploy" / "generate_rules.py"
    spec = importlib.util.spec_from_file_location("generate_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rules: str = module.rule_file(ROOT / "deploy" / "prometheus" / "rules.yml",
                                  saturation_window=window)  # fmt: skip
    return rules


def compressed(speed: float) -> Control:
    """The HPA's knobs for a day at ``speed``: every period, window and delay with it."""
    period = 3.0 * speed
    return Control(
        period=period, down_window=60.0 * speed, startup=15.0 * speed,
        window=f"{max(4, round(15 * speed))}s",
        up_policies=(("Pods", 4, period), ("Percent", 100, period)),
    )  # fmt: skip


def pods_policy(spec: str, speed: float) -> tuple[str, float, float]:
    """``--scale-up PODS/SECONDS`` as a policy, its period in the HPA's seconds compressed
    with the day (the HPA's 15 s is the controller's 3 s at speed 1)."""
    pods, _, seconds = spec.partition("/")
    try:
        policy = ("Pods", float(int(pods)), float(seconds) / 5 * speed)
    except ValueError:
        raise SystemExit(f"--scale-up: PODS/SECONDS, as 2/120: {spec!r}") from None
    if policy[1] <= 0 or policy[2] <= 0:
        raise SystemExit(f"--scale-up: PODS/SECONDS, both positive: {spec!r}")
    return policy


def swept(chosen: Sequence[Signal], targets: Sequence[str]) -> list[Signal]:
    """Each chosen signal at each of its ``targets`` (``NAME=T,T``), else at its own."""
    sweep: dict[str, list[float]] = {}
    for spec in targets:
        name, _, values = spec.partition("=")
        sweep[name] = [float(v) for v in values.split(",")]
    unknown = set(sweep) - {s.name for s in chosen}
    if unknown:
        raise SystemExit(f"--target names no chosen signal: {', '.join(sorted(unknown))}")
    return [replace(s, target=t) for s in chosen for t in sweep.get(s.name, [s.target])]


def table(reports: Sequence[Report]) -> str:
    lines = [
        "| signal | target | requests | within objective | replica-seconds | max pods | "
        "scale-ups (late) | scale-downs (hurt) | held | missed, by phase |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        missed = ", ".join(f"{name} {n}" for name, n in r.missed.items() if n) or "none"
        lines.append(
            f"| {r.signal} | {r.target:g} | {r.requests} | {r.within:.2%} | "
            f"{r.replica_seconds:.0f} | {r.max_replicas} | {r.scale_ups} ({r.late_scale_ups}) | "
            f"{r.scale_downs} ({r.hurtful_scale_downs}) | {r.held} | {missed} |"
        )
    return "\n".join(lines)


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", default="", help="names, comma-separated (default: all)")
    parser.add_argument("--speed", type=float, default=1.0, help="the day's length, x420 s")
    parser.add_argument("--seed", type=int, default=50)
    parser.add_argument(
        "--target", action="append", default=[], metavar="SIGNAL=T[,T...]",
        help="the targets to run a signal at, one run each (repeatable; default: each "
        "signal's own)",
    )  # fmt: skip
    parser.add_argument(
        "--scale-up", metavar="PODS/SECONDS",
        help="one scale-up policy in place of the HPA's default (4 pods or 100 %% per 15 s): "
        "at most PODS added per SECONDS of the HPA's time (compressed with the day)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the reports here")
    args = parser.parse_args(argv)
    scale = args.speed
    control = compressed(scale)
    if args.scale_up:
        control = replace(control, up_policies=(pods_policy(args.scale_up, scale),))
    chosen = swept(
        [s for s in signals(control.window)
         if not args.signals or s.name in args.signals.split(",")],
        args.target,
    )  # fmt: skip
    rules = load_rules(control.window)
    reports = []
    for signal in chosen:
        report = await run_signal(signal, control, args.speed, args.seed, rules)
        print(table([report]).splitlines()[-1], flush=True)
        reports.append(report)
        if args.json:  # (after each run: a long sweep's first results are kept)
            args.json.write_text(json.dumps([asdict(r) for r in reports], indent=1))
    print(table(reports))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
