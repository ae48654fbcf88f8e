"""The Grafana dashboard: generated from dashboards/generate.py, importable (structure, the
datasource as a variable), every query on catalogue metrics only, every catalogue metric on a
panel, and every panel returning data from a real Prometheus scraping a sidecar in front of the
simulated engine, with fake GPUs, the model's shape and tracing on."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmobs.export.metrics.catalogue import CATALOGUE, LATEST_USAGE, Kind
from llmobs.export.telemetry import build_telemetry
from tests.support.certs import issue
from tests.support.dashboards import (
    DASHBOARD,
    GPUS,
    MODEL_SHAPE,
    Json,
    label_values,
    load,
    panels,
    queries,
    substitute,
)
from tests.support.fake_nvml import FakeNvml
from tests.support.pd_router import pd_load, start_pair
from tests.support.prom import (
    ROOT,
    RULES,
    Prometheus,
    Target,
    finite,
    needs_prometheus,
    streaming_load,
)
from tests.support.promql import metric_names, unknown_metrics
from tests.support.realtime import realtime_load
from tests.support.servers import AppFactory, SidecarFactory, SimFactory

GENERATOR = ROOT / "dashboards" / "generate.py"
PROVISIONING = ROOT / "dashboards" / "provisioning"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ROWS = (
    "Overview", "Service-level objectives", "User experience", "Why it was slow",
    "One request, two pods (disaggregated prefill and decode)",
    "Saturation (what an autoscaler reads)",
    "Who it was slow for, and what it cost", "Load",
    "Errors and outcomes",
    "Distributions", "GPU", "Sidecar health",
)  # fmt: skip


def catalogue_problems(dashboard: Json) -> list[str]:
    problems = []
    for where, expr in queries(dashboard):
        unknown = unknown_metrics(expr, set())
        if unknown:
            problems.append(f"{where}: not in the catalogue: {sorted(unknown)}")
    return problems


def test_dashboard_is_what_the_generator_builds(tmp_path: Path) -> None:
    check = [sys.executable, str(GENERATOR), "--check"]
    done = subprocess.run(check, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    stale = tmp_path / "stale.json"
    stale.write_text(DASHBOARD.read_text().replace("llmobs_stalls_total", "llmobs_stalls"))
    stale_check = subprocess.run([*check, "--out", str(stale)], capture_output=True, check=False)
    assert stale_check.returncode == 1


def test_dashboard_structure() -> None:
    d = load()
    assert d["schemaVersion"] >= 38  # Grafana 10.0 and later
    assert d["uid"] == "llmobs" and len(d["uid"]) <= 40
    assert d["id"] is None
    assert d["title"] and d["tags"] and d["time"]["from"].startswith("now-")
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == list(ROWS)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "job", "pod", "model", "slo_window"]
    window = variables["slo_window"]  # a range every SLO panel measures over
    assert window["type"] == "custom" and window["current"]["value"] == "28d"
    assert all(re.fullmatch(r"\d+[hdw]", o["value"]) for o in window["options"])
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job", "pod", "model"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE
        assert v["includeAll"] and v["allValue"] == ".*"
        assert v["definition"] == v["query"]["query"]
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    kinds = {p["type"] for p in panels(d)}
    assert {"row", "stat", "timeseries", "heatmap"} <= kinds


def test_no_hard_coded_datasource() -> None:
    def walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "datasource":
                    yield path, v
                yield from walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")

    d = load()
    for path, ds in walk(d, "$"):
        if path.startswith("$.annotations"):
            assert ds == {"type": "grafana", "uid": "-- Grafana --"}  # built-in annotations
        else:
            assert ds == DATASOURCE, path
    for p in panels(d):
        if p["type"] != "row":
            assert p["datasource"] == DATASOURCE
            assert p["targets"], p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
            assert all(t["datasource"] == DATASOURCE and t["expr"] for t in p["targets"])


def test_panels_tile_the_grid() -> None:
    taken: set[tuple[int, int]] = set()
    for p in panels(load()):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, f"{p['title']!r} overlaps another panel"
        taken |= cells
        assert p["title"]
        if p["type"] != "row":
            assert p.get("description"), f"{p['title']!r} has no description"


def test_queries_use_only_catalogue_metrics() -> None:
    assert catalogue_problems(load()) == []


def test_a_query_outside_the_catalogue_is_caught() -> None:
    d = load()
    bad = copy.deepcopy(d)
    target = next(
        t for p in panels(bad) if p["type"] == "timeseries" for t in p["targets"]
        if "_bucket" in t["expr"]
    )  # fmt: skip
    target["expr"] = target["expr"].replace("_bucket", "_buckets", 1)
    assert len(catalogue_problems(bad)) == 1
    bad = copy.deepcopy(d)
    bad["templating"]["list"][1]["query"]["query"] = "label_values(llmobs_gpu_up, namespace)"
    assert catalogue_problems(bad) == [
        "variable 'namespace': not in the catalogue: ['llmobs_gpu_up']"
    ]


def missing_metrics(dashboard: Json) -> set[str]:
    """Catalogue metrics that no panel queries (a histogram by any of its series)."""
    used = set().union(*(metric_names(expr) for _, expr in queries(dashboard)))
    missing = set()
    for metric in CATALOGUE:
        histogram = metric.kind in (Kind.HISTOGRAM, Kind.TOKEN_HISTOGRAM)
        parts = {metric.prometheus + s for s in ("_bucket", "_sum", "_count")}
        if not (parts if histogram else {metric.prometheus}) & used:
            missing.add(metric.prometheus)
    return missing


# Keys of a dashboard export that Grafana's dashboard schema leaves out: the export header,
# the (null) database id, and the text of a query variable as the UI shows it.
EXPORT_ONLY = {".__requires", ".id"}


def unknown_keys(dashboard: Json) -> list[str]:
    """Keys of ``dashboard`` that Grafana's dashboard schema does not have: what
    grafana-foundation-sdk (its types, generated from Grafana 11.2's schema) drops when it
    reads the JSON and writes it back. Queries and plugin options it keeps as they are."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: PLC0415
    from grafana_foundation_sdk.models.dashboard import Dashboard  # noqa: PLC0415

    back = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))

    def dropped(ours: Any, theirs: Any, path: str) -> Iterator[str]:
        if isinstance(ours, dict) and isinstance(theirs, dict):
            for key, value in ours.items():
                if key not in theirs:
                    yield f"{path}.{key}"
                else:
                    yield from dropped(value, theirs[key], f"{path}.{key}")
        elif isinstance(ours, list) and isinstance(theirs, list):
            for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
                yield from dropped(a, b, f"{path}[{i}]")

    definition = re.compile(r"\.templating\.list\[\d+\]\.definition")
    return [
        key for key in dropped(dashboard, back, "")
        if key not in EXPORT_ONLY and not definition.fullmatch(key)
    ]  # fmt: skip


def test_the_dashboard_is_in_grafanas_schema() -> None:
    assert unknown_keys(load()) == []
    bad = load()
    bad["panels"][1]["gridPoss"] = {}
    bad["panels"][1]["fieldConfig"]["defaults"]["unitt"] = "s"
    bad["templating"]["list"][0]["hiden"] = 2
    assert sorted(unknown_keys(bad)) == [
        ".panels[1].fieldConfig.defaults.unitt", ".panels[1].gridPoss", ".templating.list[0].hiden",
    ]  # fmt: skip


# The newest GenAI conventions' usage counters (sidecars opted in only) count what
# llmobs_tokens_total counts by type in either mode, which the dashboard reads instead
REPEATS = {m.prometheus for m in LATEST_USAGE if m.kind is Kind.COUNTER}


def test_every_catalogue_metric_is_on_the_dashboard() -> None:
    d = load()
    assert len(REPEATS) == 4
    assert missing_metrics(d) == REPEATS
    without_gpu_row = copy.deepcopy(d)
    titles = [p["title"] for p in d["panels"]]
    gpu, health = titles.index("GPU"), titles.index("Sidecar health")
    del without_gpu_row["panels"][gpu + 1 : health]
    assert missing_metrics(without_gpu_row) - REPEATS == {
        "llmobs_gpu_memory_used_bytes", "llmobs_gpu_memory_free_bytes",
        "llmobs_gpu_memory_total_bytes", "llmobs_gpu_memory_reserved_bytes",
        "llmobs_gpu_utilization", "llmobs_gpu_memory_controller_utilization",
        "llmobs_gpu_memory_bandwidth_utilization", "llmobs_gpu_memory_bandwidth_bytes_per_second",
        "llmobs_gpu_memory_bandwidth_peak_bytes_per_second", "llmobs_gpu_power_watts",
        "llmobs_gpu_temperature_celsius", "llmobs_gpu_clock_sm_hertz",
        "llmobs_gpu_clock_memory_hertz", "llmobs_mbu", "llmobs_mfu",
    }  # fmt: skip


def test_engine_panels_use_the_uniform_names() -> None:
    """The engine's queue and KV cache through the collector, whatever the engine."""
    exprs = {where: expr for where, expr in queries(load())}
    assert not [e for e in exprs.values() if re.search(r"vllm|sglang|tgi_|llamacpp|trtllm", e)]
    for name in ("llmobs_engine_requests_waiting", "llmobs_engine_requests_running",
                 "llmobs_engine_kv_cache_usage"):  # fmt: skip
        using = [e for e in exprs.values() if name in metric_names(e)]
        assert using and all(re.search(r"by \([^)]*\bengine\b", e) for e in using), name


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('sum by (le) (rate(a_bucket{job="x", le=~"0.1|by(c)"}[5m]))', {"a_bucket"}),
        ("histogram_quantile(0.99, sum(rate(b[$__rate_interval])) by (le, pod))", {"b"}),
        ("1000 * (sum(rate(c[5m])) or vector(0)) / sum(rate(d[1m] offset 5m))", {"c", "d"}),
        ("x * on (namespace) group_left (pod) y > bool 1e3", {"x", "y"}),
        ("x and on (namespace) y", {"x", "y"}),
        ('label_replace(e, "dst", "$1", "src", "(.*)")', {"e"}),
        ("max_over_time(sum(f{pod=~\"$pod\"})[${__range}:1s] @ end())", {"f"}),
        ("vllm:num_requests_waiting + ns:rec:rate5m - Inf + NaN",
         {"vllm:num_requests_waiting", "ns:rec:rate5m"}),
        ('{__name__="g_total", job="x"}', {"g_total"}),
        ("sum without (le) (h) unless ignoring (pod) i", {"h", "i"}),
    ],
)  # fmt: skip
def test_metric_names_are_found_in_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_what_does_not_parse_is_refused() -> None:
    """The real parser refuses what Prometheus refuses (group_left with a set operator)."""
    with pytest.raises(SyntaxError):
        metric_names("x and on (namespace) group_left (pod) y")
    with pytest.raises(SyntaxError):
        metric_names("sum(rate(x[5m])")


def test_a_regex_on_the_metric_name_cannot_be_checked() -> None:
    with pytest.raises(ValueError, match="__name__"):
        metric_names('{__name__=~"llmobs_.*"}')


def test_provisioning_points_at_the_dashboard() -> None:
    (source,) = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ][:1]
    assert source["type"] == "prometheus" and source["url"].startswith("http://prometheus:")
    (provider,) = yaml.safe_load((PROVISIONING / "dashboards" / "llmobs.yaml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./dashboards/llmobs.json:{provider['options']['path']}/llmobs.json:ro" in mounts


def test_exemplars_lead_from_the_panels_to_the_traces() -> None:
    """The latency panels and the heatmaps ask for exemplars; the provisioned Prometheus data
    source opens an exemplar's trace_id in the Jaeger data source; the compose Prometheus
    stores exemplars; the PodMonitor scrapes OpenMetrics first (which carries them)."""
    d = load()
    with_exemplars = {
        p["title"] for p in panels(d) for t in p.get("targets", []) if t.get("exemplar")
    }
    assert {"Time to first token", "Inter-token latency", "Time per output token"} <= with_exemplars
    assert {p["title"] for p in panels(d) if p["type"] == "heatmap"} <= with_exemplars
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    by_uid = {s["uid"]: s for s in sources["datasources"]}
    (link,) = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == "trace_id" and by_uid[link["datasourceUid"]]["type"] == "jaeger"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage,native-histograms" in command
    monitor = yaml.safe_load(
        (ROOT / "deploy" / "kubernetes" / "base" / "podmonitor.yaml").read_text()
    )
    assert monitor["spec"]["scrapeProtocols"][:2] == ["PrometheusProto", "OpenMetricsText1.0.0"]
    assert monitor["spec"]["scrapeClassicHistograms"] is True


# --- every panel returns data from a real Prometheus -----------------------------------------

MODEL = "sim-llama-3-8b"
LABELS = {"namespace": "demo", "pod": "llm-0"}
ALL = {"namespace": ".*", "job": ".*", "pod": ".*", "model": ".*", "slo_window": "28d"}
ONE = {
    "namespace": LABELS["namespace"],
    "job": "llmobs",
    "pod": LABELS["pod"],
    "model": MODEL,
    "slo_window": "1h",
}
DATA_TIMEOUT = 40.0


COLLECTORS = {"gpu_sample_interval": 0.2, "engine_scrape_interval": 0.2}
# latency bounds, so that each request's latency against them (saturation) is observed
BOUNDS = {"slo_ttft": 2.0, "slo_tpot": 0.1}


@needs_prometheus
async def test_every_panel_returns_data(
    start_sim: SimFactory, start_sidecar: SidecarFactory, start_app: AppFactory, tmp_path: Path
) -> None:
    # Stalls every 10 steps and 10 % injected 500s, so that no panel is trivially zero.
    # The model requested is a LoRA adapter of the sim's base model (its /v1/models says so).
    sim = await start_sim(
        model="sim-base", lora_adapters=(MODEL,), stall_every=10, error_rate=0.1, max_batch=64,
        output_tokens_min=16, output_tokens_max=48, spec_tokens=4,
    )  # fmt: skip
    # Tracing on (into memory), so that llmobs_spans_dropped_total is exported.
    telemetry = build_telemetry(span_exporter=InMemorySpanExporter())
    # Tokens priced, so that the cost panels have a series to show
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: USD\nprices:\n  '*': {input: 0.5, output: 1.5}\n")
    # TLS on the proxy port, so that the handshakes and the certificate's expiry are shown
    served = issue(trustme.CA(), tmp_path)
    tls = {"tls_cert_file": str(served.cert), "tls_key_file": str(served.key)}
    side = await start_sidecar(sim.url, telemetry, nvml=FakeNvml(GPUS), **COLLECTORS,
                               **MODEL_SHAPE, price_file=str(prices), **tls, **BOUNDS)  # fmt: skip
    # A second sidecar at a P/D pair's decode pod (the same pod's labels: its listeners are
    # the pod's), so that the P/D row's panels have legs to show
    pair = await start_pair(start_sim, start_sidecar, start_app)
    # Only the sidecars are scraped: the engine's queue and KV cache come through a collector.
    targets = [Target("llmobs", side.metrics_url, LABELS),
               Target("llmobs", pair.side.metrics_url, LABELS)]  # fmt: skip
    d = load()
    pending = {
        (where, substitute(expr, values))
        for values in (ALL, ONE)
        for where, expr in queries(d)
        if not where.startswith("variable")
    }
    variables = {
        (v["name"], substitute(v["query"]["query"], values))
        for values in (ALL, ONE)
        for v in d["templating"]["list"]
        if v["type"] == "query"
    }
    # Every dialect in turn: Ollama's responses carry the engine-reported prefill and load.
    async with (
        Prometheus(tmp_path, targets) as prom,
        streaming_load(side.url, MODEL, 6, dialect="mixed", tls=served.trusting()),
        realtime_load(side.url, MODEL, served.trusting()),  # WebSocket sessions, over TLS too
        pd_load(pair),
    ):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DATA_TIMEOUT
        while pending or variables:
            pending = {(w, q) for w, q in pending if not finite(await prom.query(q))}
            variables = {(n, q) for n, q in variables if not await label_values(prom, q)}
            if loop.time() > deadline:
                break
            await asyncio.sleep(1.0)
        bandwidth = await prom.query("llmobs_gpu_memory_bandwidth_utilization")
        engines = await prom.query("llmobs_engine_kv_cache_usage")
    missing = sorted(pending) + sorted(variables)
    assert not missing, "no data (or not finite) from:\n" + "\n".join(map(str, missing))
    # The measured-bandwidth panel tells the two sources apart; the engine is recognised.
    assert {(s["gpu"], s["source"]) for s, _ in bandwidth} == {("0", "gpm"), ("1", "mem_util")}
    assert {s["engine"] for s, _ in engines} == {"vllm"}


NATIVE = {m.prometheus for m in CATALOGUE if m.native is not None}
NATIVE_RULES = [
    "namespace_job_model:gen_ai_server_time_to_first_token_seconds:histogram_quantile",
    "namespace_job_model:llmobs_inter_token_latency_seconds:histogram_quantile",
    "namespace_job_model:gen_ai_server_time_per_output_token_seconds:histogram_quantile",
    "namespace_job_model:llmobs_inter_token_latency_seconds_count:rate5m",
    "namespace_job_model:llmobs_inter_token_latency_seconds:mean5m",
    "namespace_job_model:llmobs_inter_token_latency_seconds:variance5m",
    "namespace_job_model:llmobs_stalls:per_1k_tokens_rate5m",
    "namespace_job_model:llmobs_smoothness:ratio5m",
]


@needs_prometheus
async def test_quantiles_read_the_native_histograms(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A Prometheus that scrapes protobuf with native histograms on, and (2.42) keeps only
    the native series: every panel query that can read a native histogram (quantiles, the
    ITL's count and sum) returns data from it, and so do the recording rules built on them."""
    sim = await start_sim(model=MODEL, stall_every=10, max_batch=64)
    side = await start_sidecar(sim.url, **BOUNDS)
    targets = [Target("llmobs", side.metrics_url, LABELS)]
    pending = {
        (where, substitute(expr, values))
        for values in (ALL, ONE)
        for where, expr in queries(load())
        if metric_names(expr) & NATIVE and not where.startswith("variable")
    }
    assert len(pending) >= 12  # quantiles, ITL mean and deviation, stall rate: stats, panels
    pending |= {("rule", name) for name in NATIVE_RULES}
    rules = {"rules.yml": RULES.read_text()}
    async with (
        Prometheus(tmp_path, targets, rules, features=["native-histograms"]) as prom,
        streaming_load(side.url, MODEL, 4),
    ):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DATA_TIMEOUT
        while pending and loop.time() < deadline:
            pending = {(w, q) for w, q in pending if not finite(await prom.query(q))}
            await asyncio.sleep(1.0)
        classic = await prom.query(f"{next(iter(NATIVE))}_bucket")
    assert not pending, "no data from:\n" + "\n".join(map(str, sorted(pending)))
    assert classic == []  # it did read them natively: 2.42 keeps no classic series of them


def test_substitution_leaves_no_variable() -> None:
    for _, expr in queries(load()):
        assert re.search(r"\$\w", substitute(expr, ALL)) is None
