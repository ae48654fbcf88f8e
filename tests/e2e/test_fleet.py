"""Many pods, one answer: a fleet on a real multi-Prometheus topology, checked against the
truth of every request's span.

Four sidecars, each in front of its own simulated engine with a different load and fault mix
(healthy, queue-bound, stuttering, failing a share of its requests), on two "nodes". Each
node's Prometheus runs in agent mode and remote-writes what it scrapes (native histograms
included) to a central Prometheus with the remote-write receiver, which evaluates the shipped
recording rules and alerts. Every request's trace goes to an OTLP receiver: from the spans,
the exact answers (quantiles over all requests, the ITL's mean and variance over every gap,
good and judged counts, stalls by cause) that the fleet's summed series must give. A fifth,
plain Prometheus scrapes the same sidecars without native histograms, as a user without them
would: the classic buckets' quantiles must fall in the bucket of the exact one.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmobs.config.otel import otel_settings
from llmobs.export.metrics import catalogue as c
from llmobs.export.telemetry import build_telemetry
from llmobs.tools.traffic import Workload, run_load
from tests.support.cli import cli
from tests.support.dashboards import (
    GPUS,
    MODEL_SHAPE,
    label_values,
    load,
    panels,
    queries,
    substitute,
)
from tests.support.fake_nvml import FakeNvml
from tests.support.otlp import OtlpReceiver, attributes
from tests.support.prom import (
    RULES,
    Prometheus,
    Target,
    fast_alerts,
    finite,
    needs_prometheus,
    until,
)
from tests.support.promql import metric_names
from tests.support.servers import AppFactory, SidecarFactory, SidecarHandle, SimFactory

NAMESPACE, JOB = "llm", "llmobs"
REQUESTS = 40  # per pod
ENGINE: dict[str, Any] = {"output_tokens_min": 8, "output_tokens_max": 40, "spec_tokens": 2}
SLO: dict[str, Any] = {"slo_ttft": 3.0, "slo_target": 0.99}
QUANTILES = (0.5, 0.9, 0.99)
NATIVE_ERROR = {c.TTFT: 0.03, c.TPOT: 0.03, c.DURATION: 0.03, c.ITL: 2 ** (2**-3) - 1}
SPAN_SERVER = 2  # OTLP's SPAN_KIND_SERVER


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    model: str
    engine: dict[str, Any] = field(default_factory=dict)


PODS = (
    Pod("llm-0", "node-a", "chat-8b"),  # healthy
    Pod("llm-1", "node-a", "chat-8b", {"max_batch": 1, "prefill_base": 0.08}),  # queue-bound
    Pod("llm-2", "node-b", "chat-70b", {"stall_every": 6, "stall_ms": 120}),  # stuttering
    Pod("llm-3", "node-b", "chat-3b", {"error_rate": 0.3}),  # failing 30 % of its requests
)


@dataclass
class Truth:
    """What every request's spans say, over the fleet and per pod."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)  # per token: a chunk's gap / its tokens
    itl_weight: list[float] = field(default_factory=list)  # ... counted once per token
    verdicts: Counter[str] = field(default_factory=Counter)
    good_tokens: int = 0
    stalls: Counter[str] = field(default_factory=Counter)  # by cause
    bad_by_pod: Counter[str] = field(default_factory=Counter)
    requests: int = 0


def truth_of(receiver: OtlpReceiver) -> Truth:
    truth = Truth()
    for span, resource in receiver.spans():
        attrs = attributes(span)
        pod = {a.key: a.value.string_value for a in resource.resource.attributes}["k8s.pod.name"]
        if span.kind == SPAN_SERVER:
            truth.requests += 1
            truth.duration.append((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9)
            for values, key in ((truth.ttft, "llmobs.time_to_first_token"),
                                (truth.tpot, "llmobs.time_per_output_token")):  # fmt: skip
                if key in attrs:
                    values.append(attrs[key])
            verdict = attrs.get("llmobs.slo.verdict")
            if verdict is not None:
                truth.verdicts[verdict] += 1
            if verdict == "good":
                truth.good_tokens += attrs["gen_ai.usage.output_tokens"]
            if verdict == "bad":
                truth.bad_by_pod[pod] += 1
        elif span.name == "decode":
            for event in span.events:
                e = attributes(event)
                if event.name == "token":
                    truth.itl.append(e["llmobs.token.gap"] / e["llmobs.token.count"])
                    truth.itl_weight.append(e["llmobs.token.count"])
                elif event.name == "llmobs.stall":
                    truth.stalls[e["llmobs.stall.cause"]] += 1
            assert attributes(span)["llmobs.token_events.dropped"] == 0
    return truth


def exact_quantile(
    values: Sequence[float], q: float, weights: Sequence[float] | None = None
) -> float:
    """The ``q`` quantile of the values (each counted its weight): the smallest value whose
    cumulative count reaches ``q`` of the total, the rank histogram_quantile aims at."""
    order = np.argsort(values)
    ordered = np.asarray(values)[order]
    counts = np.ones(len(values)) if weights is None else np.asarray(weights)[order]
    cumulative = np.cumsum(counts)
    return float(ordered[int(np.searchsorted(cumulative, q * cumulative[-1]))])


async def start_pod(
    pod: Pod, start_sim: SimFactory, start_sidecar: SidecarFactory, traces: str, prices: Path
) -> SidecarHandle:
    sim = await start_sim(model="base", lora_adapters=(pod.model,), seed=len(pod.name),
                          **ENGINE, **pod.engine)  # fmt: skip
    otel = otel_settings({
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces,
        "OTEL_RESOURCE_ATTRIBUTES": f"k8s.pod.name={pod.name}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    })  # fmt: skip
    return await start_sidecar(
        sim.url, build_telemetry(otel=otel), nvml=FakeNvml(GPUS), token_events=1024,
        engine_scrape_interval=0.5, gpu_sample_interval=0.5, price_file=str(prices),
        **MODEL_SHAPE, **SLO,
    )  # fmt: skip


async def scalar(prom: Prometheus, expr: str) -> float:
    ((_, value),) = await prom.query(expr)
    return value


@needs_prometheus
@pytest.mark.timeout(300)
async def test_the_fleet_answers_equal_the_truth(
    start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory, tmp_path: Path
) -> None:
    receiver = OtlpReceiver()
    traces = await start_app(receiver.app()) + "/v1/traces"
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: USD\nprices:\n  '*': {input: 0.5, output: 1.5}\n")
    sides = [await start_pod(p, start_sim, start_sidecar, traces, prices) for p in PODS]
    targets = [
        Target(JOB, side.metrics_url, {"namespace": NAMESPACE, "pod": pod.name})
        for pod, side in zip(PODS, sides, strict=True)
    ]
    workdirs = {name: tmp_path / name for name in ("central", "node-a", "node-b", "classic")}
    for workdir in workdirs.values():
        workdir.mkdir()
    rules = {"rules.yml": RULES.read_text(), "alerts.yml": fast_alerts()}
    central = Prometheus(workdirs["central"], [], rules, ["native-histograms"], receiver=True)
    write = central.url + "/api/v1/write"
    agents = [
        Prometheus(
            workdirs[node],
            [t for t, p in zip(targets, PODS, strict=True) if p.node == node],
            features=["native-histograms"],
            agent=True,
            remote_write=write,
            external_labels={"node": node},
        )
        for node in ("node-a", "node-b")
    ]
    classic = Prometheus(workdirs["classic"], targets)
    async with central, agents[0], agents[1], classic:
        # every pod's samples flowing to both before the first request: a series' first
        # sample is then its 0 (the closed label sets', born at start-up)
        active = c.ACTIVE.prometheus
        await until(central, f"count({active})", len(PODS))
        await until(classic, f"count({active})", len(PODS))
        dashboard = asyncio.ensure_future(panels_answer(central, classic))
        await asyncio.gather(*(
            run_load(side.url, Workload(pod.model, seed=i, long_share=0.0, dialect="mixed"),
                     duration=120.0, concurrency=3, on_result=lambda r: None,
                     max_requests=REQUESTS)
            for i, (pod, side) in enumerate(zip(PODS, sides, strict=True))
        ))  # fmt: skip
        missing = await dashboard
        for side in sides:
            side.sidecar.flush_records()  # on the loop, which owns the relay
            await asyncio.to_thread(export_traces, side)
        truth = truth_of(receiver)
        assert truth.requests == REQUESTS * len(PODS)
        await until(central, "sum(llmobs_requests_total)", truth.requests)
        await until(classic, "sum(llmobs_requests_total)", truth.requests)
        figures = await check_answers(central, classic, truth)
        await check_alerts_and_gate(central, truth)
        worst = await worst_pods(central)
        figures["worst pods"] = worst
        series = await central.query('count by (pod) ({__name__=~".+", pod=~"llm-.+"})')
        figures["series per pod"] = {s["pod"]: v for s, v in series}
    # a pod none of whose requests was bad has no misses to show, nor a bad request's cost;
    # the TLS panels have data only where TLS is on, the WebSocket ones where sessions run,
    # the P/D ones where requests are disaggregated (tests/deploy/test_dashboards.py: all there)
    missing = [(where, pod, expr) for where, pod, expr in missing
               if (pod in (".*", *truth.bad_by_pod) or not about_bad_requests(expr))
               and not about_tls(expr) and not about(c.SESSION_METRICS, expr)
               and not about(c.PD_METRICS, expr)]  # fmt: skip
    assert not missing, "no data (or not finite) from:\n" + "\n".join(map(str, missing))
    # the table points at the pod to open: the queue-bound one's TTFT, the stuttering one's
    # stalls, the failing one's budget
    for column in worst.values():  # a row per pod, in every column
        assert set(column) == {pod.name for pod in PODS}, worst
    assert max(worst["TTFT P99"], key=worst["TTFT P99"].__getitem__) == "llm-1"
    assert max(worst["Stalls / 1k tokens"], key=worst["Stalls / 1k tokens"].__getitem__) == "llm-2"
    assert min(worst["Budget left"], key=worst["Budget left"].__getitem__) == "llm-3"
    print(json.dumps(figures, indent=1))  # the figures docs/benchmarks.md records


def export_traces(side: SidecarHandle) -> None:
    """Write and export every pending trace, in a thread: the export posts to the receiver
    that this test's event loop serves."""
    tracing, processor = side.sidecar.proxy.tracing, side.sidecar.telemetry.span_processor
    assert tracing is not None and processor is not None
    tracing.drain()
    processor.force_flush()


async def check_answers(central: Prometheus, classic: Prometheus, truth: Truth) -> dict[str, Any]:
    """Quantiles, the ITL's mean and variance, SLO counts and stalls: the fleet's summed
    series against the spans. Returns the errors measured."""
    figures: dict[str, Any] = {}
    exact_values = {
        c.TTFT: (truth.ttft, None), c.TPOT: (truth.tpot, None),
        c.DURATION: (truth.duration, None), c.ITL: (truth.itl, truth.itl_weight),
    }  # fmt: skip
    for metric, (values, weights) in exact_values.items():
        name = metric.prometheus
        for q in QUANTILES:
            exact = exact_quantile(values, q, weights)
            native = await scalar(central, f"histogram_quantile({q}, sum({name}))")
            error = abs(native - exact) / exact
            figures[f"{name} p{q * 100:g} native error"] = round(error, 5)
            assert error <= NATIVE_ERROR[metric], (name, q, native, exact)
            bucketed = await scalar(
                classic, f"histogram_quantile({q}, sum by (le) ({name}_bucket))"
            )
            bounds = (0.0, *metric.buckets, math.inf)
            at = int(np.searchsorted(bounds, exact))  # the classic bucket holding it
            assert bounds[at - 1] <= bucketed <= bounds[at], (name, q, bucketed, exact)
    itl = c.ITL.prometheus
    count = await scalar(central, f"histogram_count(sum({itl}))")
    total = await scalar(central, f"histogram_sum(sum({itl}))")
    squares = await scalar(central, f"sum({c.ITL_SQUARES.prometheus})")
    gaps, tokens = np.asarray(truth.itl), np.asarray(truth.itl_weight)
    exact_mean = float(np.sum(gaps * tokens) / np.sum(tokens))
    exact_variance = float(np.sum(tokens * (gaps - exact_mean) ** 2) / np.sum(tokens))
    assert count == np.sum(tokens)
    mean, variance = total / count, squares / count - (total / count) ** 2
    figures["itl mean relative error"] = abs(mean - exact_mean) / exact_mean
    figures["itl variance relative error"] = abs(variance - exact_variance) / exact_variance
    assert figures["itl mean relative error"] < 1e-6
    assert figures["itl variance relative error"] < 1e-6
    slo = c.SLO_REQUESTS.prometheus
    verdicts = {s["verdict"]: v for s, v in await central.query(f"sum by (verdict) ({slo})")}
    assert verdicts == {"good": truth.verdicts["good"], "bad": truth.verdicts["bad"]}
    goodput = await scalar(central, f'sum({c.SLO_OUTPUT_TOKENS.prometheus}{{verdict="good"}})')
    assert goodput == truth.good_tokens
    stalls = {s["cause"]: v for s, v in
              await central.query(f"sum by (cause) ({c.STALLS.prometheus}) > 0")}  # fmt: skip
    assert stalls == dict(truth.stalls) and stalls
    return figures


async def check_alerts_and_gate(central: Prometheus, truth: Truth) -> None:
    """The page alert fires on the central Prometheus for the failing pod's label set only;
    ``llmobs slo --by pod`` says which pod holds the misses."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 40.0
    firing: set[str] = set()
    while not firing and loop.time() < deadline:
        firing = await paging(central, ("firing",))
        await asyncio.sleep(1.0)
    assert firing == {"chat-3b"}
    await asyncio.sleep(3.0)  # three evaluations later, no other label set even pending
    assert await paging(central, ("pending", "firing")) == {"chat-3b"}
    code, text = await asyncio.to_thread(
        cli, "slo", "--prometheus", central.url, "--range", "5m", "--by", "pod", "--json"
    )
    assert code == 1  # chat-3b is below its target
    report = json.loads(text)
    held: Counter[str] = Counter()
    for row in report["misses_by"]["label_sets"]:
        assert (row["model"], row["pod"]) == ("chat-3b", "llm-3")
        held[row["pod"]] += row["bad"]
    # increase() over the range, extrapolated from the first and last samples: near the truth
    assert set(held) == set(truth.bad_by_pod)
    for pod, bad in truth.bad_by_pod.items():
        assert 0.5 * bad <= held[pod] <= 1.5 * bad, (held, truth.bad_by_pod)


async def paging(central: Prometheus, states: tuple[str, ...]) -> set[str]:
    """The models the page alert is in one of ``states`` for, at the central Prometheus."""
    return {a["labels"]["gen_ai_request_model"] for a in await central.alerts()
            if a["labels"]["alertname"] == "LLMObsSLOErrorBudgetBurn"
            and a["state"] in states}  # fmt: skip


EVERY = {"namespace": ".*", "job": ".*", "pod": ".*", "model": ".*", "slo_window": "1h"}


async def worst_pods(central: Prometheus) -> dict[str, dict[str, float]]:
    """The dashboard's "Worst pods" table at the central Prometheus, over the whole run (a
    5 m rate window): by column, each pod's value."""
    (table,) = [p for p in panels(load()) if p["title"] == "Worst pods"]
    out = {}
    for t in table["targets"]:
        expr = substitute(t["expr"], EVERY, rate_interval="5m")
        out[t["legendFormat"]] = {s["pod"]: v for s, v in await central.query(expr)}
    return out


def about_tls(expr: str) -> bool:
    return bool({m.prometheus for m in c.TRANSPORT_METRICS} & metric_names(expr))


def about(metrics: tuple[c.MetricDef, ...], expr: str) -> bool:
    """A query of one of ``metrics`` (its histograms' series by their suffixes too)."""
    names = {m.prometheus for m in metrics}
    return bool({f"{n}{s}" for n in names for s in ("", "_bucket", "_sum", "_count")}
                & metric_names(expr))  # fmt: skip


def about_bad_requests(expr: str) -> bool:
    return c.SLO_MISSES.prometheus in metric_names(expr) or 'verdict="bad"' in expr


async def panels_answer(central: Prometheus, classic: Prometheus) -> list[tuple[str, str, str]]:
    """Every dashboard panel's queries with every pod ("All") and with one pod at a time,
    evaluated while the load runs: each returns data from the central Prometheus, or (the
    heatmaps, which read the classic buckets a native-histogram Prometheus 2.42 does not keep)
    from the plain one. Returns what never did."""
    d = load()
    every = EVERY
    choices = [every] + [{**every, "namespace": NAMESPACE, "job": JOB, "pod": p.name}
                         for p in PODS]  # fmt: skip
    pending = {(where, values["pod"], substitute(expr, values))
               for values in choices for where, expr in queries(d)
               if not where.startswith("variable")}  # fmt: skip
    classic_only = {n + "_bucket" for n in (m.prometheus for m in c.CATALOGUE if m.native)}
    variables = {(v["name"], substitute(v["query"]["query"], every))
                 for v in d["templating"]["list"] if v["type"] == "query"}  # fmt: skip
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60.0
    while (pending or variables) and loop.time() < deadline:
        still = set()
        for where, pod, expr in pending:
            source = classic if metric_names(expr) <= classic_only else central
            if not finite(await source.query(expr)):
                still.add((where, pod, expr))
        pending = still
        variables = {(n, q) for n, q in variables if not await label_values(central, q)}
        await asyncio.sleep(1.0)
    return sorted(pending) + sorted((name, ".*", query) for name, query in variables)
