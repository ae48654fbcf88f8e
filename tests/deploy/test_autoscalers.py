"""The autoscaler overlays, validated offline: each renders with the real kustomize, every
object validates (KEDA's ScaledObject against the schema derived from KEDA's CRD, built-in
kinds with kubernetes-validate --strict), the autoscaler scales a Deployment of its own build
that the PodMonitor scrapes, and the PromQL it ends up running (KEDA's trigger query, or
prometheus-adapter's rule as the adapter fills it in) reads only series that
deploy/prometheus/rules.yml records, for the namespace and job of those pods. Missing data
holds the replica count (ignoreNullValues "false"), thresholds are numbers, and scaling down
waits at least five minutes."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema
import promql_parser
import pytest
import yaml

from tests.deploy.test_alerts import recorded
from tests.deploy.test_deploy import KUBERNETES, SCHEMAS, manifest_problems
from tests.support.kustomize import build, needs_kubectl
from tests.support.promql import metric_names

Doc = dict[str, Any]

SATURATION = "namespace_job:llmobs_saturation:ratio"
PREFILL_BACKLOG = "namespace_job_role:llmobs_prefill_backlog_seconds:sum"
HPA_OVERLAY = "overlays/autoscale-hpa"
ADAPTER_RULES = KUBERNETES / HPA_OVERLAY / "prometheus-adapter-rules.yaml"
# The HPA's default scale-down window: shorter would give a pod back between two bursts.
MIN_SCALE_DOWN_WINDOW = 300


@dataclass(frozen=True)
class Expected:
    """What an overlay is built on, its autoscaler's kind, and the series it scales on."""

    built_on: str
    kind: str
    series: str
    metric_type: str
    matchers: tuple[tuple[str, str], ...] = ()  # beyond namespace and job


OVERLAYS = {
    "overlays/autoscale-keda": Expected("overlays/cpu-sim", "ScaledObject", SATURATION, "Value"),
    "overlays/autoscale-keda-prefill": Expected(
        "overlays/pd-prefill", "ScaledObject", PREFILL_BACKLOG, "AverageValue",
        (("pd_role", "prefill_leg"),),
    ),
    HPA_OVERLAY: Expected("overlays/cpu-sim", "HorizontalPodAutoscaler", SATURATION, "Value"),
}  # fmt: skip


@dataclass(frozen=True)
class Signal:
    """What an autoscaler reads: the PromQL that runs, its threshold as written, the type."""

    query: str
    threshold: str
    metric_type: str


def problems(doc: Doc) -> list[str]:
    """KEDA's ScaledObject against its CRD's schema; everything else as test_deploy checks it."""
    if doc["kind"] != "ScaledObject":
        return manifest_problems(doc)
    schema = json.loads((SCHEMAS / "scaledobject.schema.json").read_text())
    return [
        f"{list(e.absolute_path)}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc)
    ]


def named(doc: Doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def the(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def scaled(docs: list[Doc], scaler: Doc) -> Doc:
    """The Deployment of the build that ``scaler`` names."""
    name = scaler["spec"]["scaleTargetRef"]["name"]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert name in deployments, (name, sorted(deployments))
    return deployments[name]


def behavior(scaler: Doc) -> Doc:
    spec = scaler["spec"]
    if scaler["kind"] == "ScaledObject":
        spec = spec["advanced"]["horizontalPodAutoscalerConfig"]
    out: Doc = spec["behavior"]
    return out


def replica_bounds(scaler: Doc) -> tuple[int, int]:
    spec = scaler["spec"]
    if scaler["kind"] == "ScaledObject":
        return spec["minReplicaCount"], spec["maxReplicaCount"]
    return spec["minReplicas"], spec["maxReplicas"]


def adapter_rule(metric: str) -> Doc:
    """prometheus-adapter's external rule that serves ``metric``."""
    rules = yaml.safe_load(ADAPTER_RULES.read_text())["rules"]["external"]
    (rule,) = [r for r in rules if r["name"]["as"] == metric]
    out: Doc = rule
    return out


def adapter_query(rule: Doc, namespace: str, selector: dict[str, str]) -> str:
    """The PromQL prometheus-adapter runs for an HPA in ``namespace`` selecting ``selector``:
    the series its rule discovers, matched by the HPA's namespace and labels."""
    (series,) = metric_names(rule["seriesQuery"])
    assert re.fullmatch(rule["name"]["matches"], series), (rule["name"], series)
    assert rule["resources"].get("namespaced", True)  # the HPA's namespace is a matcher
    matchers = ",".join(f'{k}="{v}"' for k, v in {"namespace": namespace, **selector}.items())
    query: str = rule["metricsQuery"]
    return query.replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)


def signals(scaler: Doc) -> list[Signal]:
    """Each metric the autoscaler reads, as the PromQL that will run for it."""
    if scaler["kind"] == "ScaledObject":
        return [
            Signal(t["metadata"]["query"], t["metadata"]["threshold"], t["metricType"])
            for t in scaler["spec"]["triggers"]
            if t["type"] == "prometheus"
        ]
    out = []
    for metric in scaler["spec"]["metrics"]:
        external = metric["external"]
        rule = adapter_rule(external["metric"]["name"])
        selector = external["metric"]["selector"]["matchLabels"]
        query = adapter_query(rule, scaler["metadata"]["namespace"], selector)
        target = external["target"]
        out.append(Signal(query, target["value"], target["type"]))
    return out


def selectors(query: str) -> dict[str, dict[str, str]]:
    """Series name -> its equality matchers, for every vector selector of ``query``."""
    found: dict[str, dict[str, str]] = {}

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            found[node.name] = {
                m.name: m.value
                for m in node.matchers.matchers
                if m.op == promql_parser.MatchOp.Equal
            }

    promql_parser.walk(promql_parser.parse(query), visit)
    return found


# --- the overlays build and validate --------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscaler_overlays_validate(overlay: str) -> None:
    """Everything of the overlay it is built on, plus one autoscaler; every object valid."""
    expected = OVERLAYS[overlay]
    docs = build(KUBERNETES / overlay)
    underneath = {named(d) for d in build(KUBERNETES / expected.built_on)}
    assert {named(d) for d in docs} - underneath == {named(the(docs, expected.kind))}
    assert underneath <= {named(d) for d in docs}
    assert {named(d): problems(d) for d in docs} == {named(d): [] for d in docs}


@needs_kubectl
def test_validation_catches_mistakes() -> None:
    docs = build(KUBERNETES / "overlays/autoscale-keda")
    scaler = the(docs, "ScaledObject")
    trigger: tuple[str | int, ...] = ("spec", "triggers", 0, "metadata")
    mistakes: dict[str, tuple[tuple[str | int, ...], object]] = {
        "a number where KEDA reads a string": ((*trigger, "threshold"), 0.7),
        "a boolean where KEDA reads a string": ((*trigger, "ignoreNullValues"), False),
        "the HPA's word in a ScaledObject": (("spec", "maxReplicas"), 8),
        "a typo": (("spec", "pollingIntervall"), 15),
        "polling never": (("spec", "pollingInterval"), 0),
    }
    for why, ((*where, key), value) in mistakes.items():
        broken = copy.deepcopy(scaler)
        node: Any = broken
        for step in where:
            node = node[step]
        node[key] = value
        assert problems(broken), why
    hpa = the(build(KUBERNETES / HPA_OVERLAY), "HorizontalPodAutoscaler")
    hpa["spec"]["behavior"]["scaleDown"]["stabilisationWindowSeconds"] = 300
    assert problems(hpa)


# --- what the autoscaler scales, and on what ------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_autoscaler_scales_a_deployment_of_its_build(overlay: str) -> None:
    """Its target is a Deployment of the build, in its namespace, scraped by the build's
    PodMonitor, without a replica count of its own for kubectl apply to reset."""
    docs = build(KUBERNETES / overlay)
    scaler = the(docs, OVERLAYS[overlay].kind)
    ref = scaler["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"]) == ("apps/v1", "Deployment")
    target = scaled(docs, scaler)
    assert scaler["metadata"]["namespace"] == target["metadata"]["namespace"]
    assert "replicas" not in target["spec"]
    pod = target["spec"]["template"]
    assert "llmobs" in {c["name"] for c in pod["spec"]["containers"]}
    monitor = the(docs, "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    low, high = replica_bounds(scaler)
    assert 1 <= low <= high  # KEDA's CRD says so in CEL, which the JSON schema cannot


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_autoscaler_reads_recorded_series_of_its_pods(overlay: str) -> None:
    """One series from a recording rule of deploy/prometheus/rules.yml, for the namespace
    and job of the pods it scales, against a threshold that is a positive number."""
    expected = OVERLAYS[overlay]
    docs = build(KUBERNETES / overlay)
    scaler = the(docs, expected.kind)
    target = scaled(docs, scaler)
    job_label = the(docs, "PodMonitor")["spec"]["jobLabel"]
    job = target["spec"]["template"]["metadata"]["labels"][job_label]
    records = set(recorded())
    (signal,) = signals(scaler)
    missing = metric_names(signal.query) - records
    assert not missing, f"not recorded by deploy/prometheus/rules.yml: {sorted(missing)}"
    matchers = {"namespace": target["metadata"]["namespace"], "job": job, **dict(expected.matchers)}
    assert selectors(signal.query) == {expected.series: matchers}
    # one series whatever the pods: an aggregation over everything (KEDA refuses more)
    tree = promql_parser.parse(signal.query)
    assert isinstance(tree, promql_parser.AggregateExpr) and tree.modifier is None, signal.query
    assert signal.metric_type == expected.metric_type
    assert isinstance(signal.threshold, str) and float(signal.threshold) > 0


@needs_kubectl
@pytest.mark.parametrize("overlay", [o for o, e in OVERLAYS.items() if e.kind == "ScaledObject"])
def test_keda_holds_on_missing_data(overlay: str) -> None:
    """An empty answer is an error (the HPA holds), never a 0 that scales in."""
    scaler = the(build(KUBERNETES / overlay), "ScaledObject")
    triggers = scaler["spec"]["triggers"]
    assert triggers and all(t["type"] == "prometheus" for t in triggers)
    assert [t["metadata"]["ignoreNullValues"] for t in triggers] == ["false"] * len(triggers)
    assert scaler["spec"]["minReplicaCount"] >= 1  # no scaling to zero on an absent series


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scaling_down_waits_and_scaling_up_is_paced(overlay: str) -> None:
    scaler = the(build(KUBERNETES / overlay), OVERLAYS[overlay].kind)
    down, up = behavior(scaler)["scaleDown"], behavior(scaler)["scaleUp"]
    assert MIN_SCALE_DOWN_WINDOW <= down["stabilizationWindowSeconds"] <= 3600  # the API's max
    for policy in (*down["policies"], *up["policies"]):
        assert policy["type"] in ("Pods", "Percent") and policy["value"] > 0
        assert 0 < policy["periodSeconds"] <= 1800  # the API's bounds
