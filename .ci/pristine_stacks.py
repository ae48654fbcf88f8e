"""The container and the stacks built on it, as .ci/pristine.py checks them: what the
Dockerfile builds (read with dockerfile-parse), the files its `pip install .` sees, and the
containers of docker-compose.yml's default stack and of the Kubernetes cpu-sim overlay, run as
processes on loopback with their own health checks and probes.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser
from pristine_processes import ROOT, Failed, Venv, processes, samples, say, scrape, wait_for


@dataclass(frozen=True)
class Image:
    """What the Dockerfile builds, read with dockerfile-parse: its files, install, commands."""

    copies: tuple[tuple[str, str], ...]
    install: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    healthcheck: tuple[str, ...]
    python: str

    @classmethod
    def read(cls) -> Image:
        parser = DockerfileParser(str(ROOT / "Dockerfile"))
        base = parser.baseimage or ""
        python = re.match(r"python:(\d+\.\d+)", base)
        copies: list[tuple[str, str]] = []
        install = ""
        for step in parser.structure:
            if step["instruction"] == "COPY" and not install:
                *sources, dest = shlex.split(step["value"])
                copies += [(source, dest) for source in sources]
            if step["instruction"] == "RUN" and not install:
                install = next((part.strip() for part in step["value"].split("&&")
                                if "pip install" in part), "")  # fmt: skip
        health = next(s["value"] for s in parser.structure if s["instruction"] == "HEALTHCHECK")
        return cls(
            copies=tuple(copies),
            install=install,
            entrypoint=tuple(json.loads(_last(parser, "ENTRYPOINT"))),
            cmd=tuple(json.loads(_last(parser, "CMD"))),
            healthcheck=tuple(json.loads(health[health.index("CMD") + 3 :])),
            python=python.group(1) if python else "",
        )


def _last(parser: DockerfileParser, instruction: str) -> str:
    values = [s["value"] for s in parser.structure if s["instruction"] == instruction]
    if not values:
        raise Failed(f"the Dockerfile has no {instruction}")
    return str(values[-1])


def stage(image: Image, work: Path) -> Path:
    """What the image's `pip install .` sees: the files the Dockerfile copies, taken from the
    build context that .dockerignore leaves (matched by docker-py, as Docker matches it)."""
    ignore = ROOT / ".dockerignore"
    patterns = [
        line.strip()
        for line in (ignore.read_text().splitlines() if ignore.exists() else [])
        if line.strip() and not line.startswith("#")
    ]
    sent = {p for p in exclude_paths(str(ROOT), patterns) if (ROOT / p).is_file()}
    installed = work / "image-src"
    for copied, dest in image.copies:
        source = copied.strip("/")
        files = [p for p in sent if p == source or p.startswith(f"{source}/")]
        if not files:
            raise Failed(f"COPY {source}: not in the build context (.dockerignore?)")
        for path in files:
            if path == source:  # a file: into a folder (dest/) or as dest
                target = (
                    installed / dest / Path(path).name if dest.endswith("/") else installed / dest
                )
            else:  # a folder's contents go into dest
                target = installed / dest / Path(path).relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, target)
    return installed


@dataclass(frozen=True)
class Workload:
    """One container of a stack: its command and environment, addresses mapped to loopback."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    probes: tuple[str, ...] = ()  # URLs that must answer 200 (Kubernetes' httpGet probes)
    health: tuple[str, ...] = ()  # a command that must exit 0 (a compose or image healthcheck)


def loopback(value: str, hosts: Mapping[str, Mapping[int, int]]) -> str:
    """Service names become 127.0.0.1, and service ports the ports their containers listen on
    (all share one network here, as the containers of a pod do)."""

    def local(match: re.Match[str]) -> str:
        port = match.group(2)
        if port is None:
            return "//127.0.0.1"
        return f"//127.0.0.1:{hosts[match.group(1)].get(int(port), int(port))}"

    for host in hosts:
        value = re.sub(rf"//({re.escape(host)})(?::(\d+))?\b", local, value)
    return value


def compose_stack(image: Image) -> list[Workload]:
    """docker-compose.yml's default stack: the services that run the llmobs image."""
    services: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    hosts: dict[str, dict[int, int]] = {"sim": {}, "llmobs": {}, "jaeger": {}}
    stack = []
    for name, service in services.items():
        if "profiles" in service or not str(service.get("image", "")).startswith("llmobs:"):
            continue
        entry = service.get("entrypoint", list(image.entrypoint))
        env = {k: loopback(str(v), hosts) for k, v in service.get("environment", {}).items()}
        check = service.get("healthcheck", {})
        health = (
            ()
            if check.get("disable")
            else tuple(check.get("test", ["CMD", *image.healthcheck])[1:])
        )
        argv = (*entry, *service.get("command", image.cmd))
        stack.append(Workload(name, argv, env, health=health))
    return stack


def kubernetes_stack(image: Image, rendered: Path) -> list[Workload]:
    """The cpu-sim overlay as `kubectl kustomize` renders it: every container of the image."""
    documents = [d for d in yaml.safe_load_all(rendered.read_text()) if d]
    hosts: dict[str, dict[int, int]] = {}
    for service in (d for d in documents if d["kind"] == "Service"):
        hosts[service["metadata"]["name"]] = {
            port["port"]: _container_port(documents, port.get("targetPort", port["port"]))
            for port in service["spec"]["ports"]
        }
    stack = []
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if not container["image"].split("/")[-1].startswith("llmobs:"):
                continue
            argv = (*container.get("command", image.entrypoint), *container.get("args", image.cmd))
            env = {e["name"]: loopback(str(e["value"]), hosts) for e in container.get("env", [])}
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            probes = tuple(
                f"http://127.0.0.1:{ports.get(p['httpGet']['port'], p['httpGet']['port'])}"
                f"{p['httpGet']['path']}"
                for key in ("startupProbe", "readinessProbe", "livenessProbe")
                if (p := container.get(key)) and "httpGet" in p
            )  # fmt: skip
            stack.append(Workload(container["name"], argv, env, probes))
    return stack


def _container_port(documents: list[dict[str, Any]], target: int | str) -> int:
    if isinstance(target, int):
        return target
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for port in container.get("ports", []):
                if port.get("name") == target:
                    return int(port["containerPort"])
    raise Failed(f"no container port is named {target}")


def run_stack(venv: Venv, name: str, stack: list[Workload], logs: Path) -> None:
    """Start the stack's containers as processes, probe each, let its load run, read /metrics."""
    metrics = "http://127.0.0.1:9464/metrics"
    with processes(venv, logs) as running:
        for workload in stack:
            load = "LOAD_URL" in workload.env  # the load generator: 4 s of it, not forever
            env = {**workload.env, "LOAD_DURATION": "4"} if load else workload.env
            running.start(f"{name}-{workload.name}", workload.argv, env, may_finish=load)
            for probe in workload.probes:
                wait_for(probe, running)
            deadline = time.monotonic() + 30
            while (
                workload.health
                and subprocess.run(
                    workload.health, env=venv.env(workload.env), capture_output=True, check=False
                ).returncode
            ):
                running.check_alive()
                if time.monotonic() > deadline:
                    raise Failed(f"{name} {workload.name}: {workload.health} never succeeded")
                time.sleep(0.5)
        time.sleep(5)
        running.check_alive()
        ok = sum(v for labels, v in samples(scrape(metrics), "llmobs_requests_total")
                 if 'outcome="ok"' in labels)  # fmt: skip
        if ok < 3:
            raise Failed(f"{name}: its load generator's requests: {ok} ok in /metrics")
    say(f"  {name}: {', '.join(w.name for w in stack)} up, probes answered, {ok:.0f} requests ok")
