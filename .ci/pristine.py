"""A user's install, checked the way a user runs it (called by .ci/run).

Green tests in a virtual environment with the test extras prove little about `pip install .`:
a module imported at run time but declared only as a test dependency passes them all. So each
install here starts from an empty virtual environment and gets exactly what a user's gets:

- readme:    the README's first command, as written (`pip install .` in the checkout), then
             `llmobs --help`, a short `llmobs demo` whose summary is read back, and
             `llmobs serve` in front of `llmobs sim` with one streamed request and /metrics
             read in all three formats;
- container: what the Dockerfile does: only the files it COPYs, its `pip install .`, its
             ENTRYPOINT and CMD, its HEALTHCHECK command; then the commands and environment
             of docker-compose.yml's default stack and of the Kubernetes cpu-sim overlay (as
             `kubectl kustomize` renders it) run as processes on loopback, with their own
             health checks and probes, and their load generator's requests counted in
             /metrics; where a Docker daemon answers, the image is built and run too;
- lowest:    the runtime dependencies at the lowest versions pyproject.toml allows (uv's
             lowest-direct resolution), then the same checks as readme.

Run it with the project's test environment (it reads YAML and the Dockerfile with kept
parsers): `python .ci/pristine.py [readme|container|lowest ...]`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parent.parent
PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"


class Failed(Exception):
    """A check that did not hold: the message says what a user would have seen."""


def say(text: str) -> None:
    print(f"pristine: {text}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Venv:
    """An empty virtual environment: its bin/ goes first on PATH, as `source activate` does."""

    path: Path

    @classmethod
    def create(cls, where: Path, name: str) -> Venv:
        path = where / name
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        return cls(path)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.path)
        env.update(extra or {})
        return env

    def shell(self, command: str, cwd: Path, timeout: float = 600) -> str:
        """Run a command line as a user types it, inside this environment."""
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=self.env(), text=True,
                              capture_output=True, timeout=timeout, check=False)  # fmt: skip
        if done.returncode != 0:
            raise Failed(f"`{command}` exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout + done.stderr


# --- reading what a user is told to type -----------------------------------------------------


def readme_first_command() -> tuple[str, str]:
    """The README's first command, split into its install and its run."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh|console)\n(.*?)```", text, re.S)
    if block is None:
        raise Failed("README.md has no command block")
    first = block.group(1).splitlines()[0].split("#", 1)[0].strip()
    install, _, run = first.partition("&&")
    if not run.strip().startswith("llmobs demo"):
        raise Failed(f"README.md's first command no longer runs the demo: {first!r}")
    return install.strip(), run.strip()


# --- processes and HTTP ----------------------------------------------------------------------


@dataclass
class Processes:
    """Processes started for one check; all are ended (SIGTERM, then SIGKILL) on exit."""

    venv: Venv
    logs: Path
    started: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    may_finish: set[str] = field(default_factory=set)

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
        may_finish: bool = False,
    ) -> None:  # fmt: skip
        """Start a server (it must stay up) or, with ``may_finish``, a client (it may exit 0)."""
        with (self.logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(list(argv), env=self.venv.env(env), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.started.append((name, proc))
        if may_finish:
            self.may_finish.add(name)

    def check_alive(self) -> None:
        for name, proc in self.started:
            code = proc.poll()
            if code is not None and (code != 0 or name not in self.may_finish):
                raise Failed(f"{name} exited {code}:\n{self.log(name)}")

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for _, proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def processes(venv: Venv, logs: Path) -> Iterator[Processes]:
    running = Processes(venv, logs)
    try:
        yield running
    except Failed:
        for name, _ in running.started:
            print(f"--- {name}'s log ---\n{running.log(name)}", file=sys.stderr)
        raise
    finally:
        running.stop()


def get(url: str, accept: str | None = None, timeout: float = 5) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def wait_for(url: str, running: Processes, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        running.check_alive()
        with contextlib.suppress(OSError):
            if get(url, timeout=2)[0] == 200:
                return
        if time.monotonic() > deadline:
            raise Failed(f"{url} did not answer 200 within {seconds:.0f} s")
        time.sleep(0.2)


def stream_one_chat(base: str) -> int:
    """One streamed chat completion as a client sends it; returns the content events."""
    body = json.dumps({"model": "pristine-check", "stream": True, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()  # fmt: skip
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
            raise Failed(f"the stream came back as {response.headers.get('Content-Type')}")
        events = [line[6:] for line in response.read().decode().splitlines()
                  if line.startswith("data: ")]  # fmt: skip
    if not events or events[-1] != "[DONE]":
        raise Failed(f"the stream did not end in [DONE]: {events[-3:]}")
    return sum(1 for e in events[:-1] if json.loads(e)["choices"][0]["delta"].get("content"))


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) of every sample of ``name`` in a text exposition."""
    found = re.findall(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M)
    return [(labels, float(value)) for labels, value in found]


def scrape(metrics: str) -> str:
    """/metrics in the three formats Prometheus asks for; returns the text one."""
    formats = {
        "text/plain": "text/plain; version=0.0.4",
        "application/openmetrics-text": "application/openmetrics-text; version=1.0.0",
        "application/vnd.google.protobuf": "application/vnd.google.protobuf;"
        "proto=io.prometheus.client.MetricFamily;encoding=delimited",
    }
    text = ""
    for expected, accept in formats.items():
        status, kind, body = get(metrics, accept)
        if status != 200 or not kind.startswith(expected) or not body:
            raise Failed(f"/metrics asked for {expected}: {status} {kind}, {len(body)} bytes")
        if expected == "text/plain":
            text = body.decode()
    return text


# --- the checks ------------------------------------------------------------------------------


def check_demo(venv: Venv, run: str) -> None:
    """The README's demo, shortened: its summary must count requests, all of them ok."""
    port, metrics_port = free_port(), free_port()
    out = venv.shell(f"{run} --duration 3 --linger 0 --port {port} --metrics-port {metrics_port}",
                     ROOT, timeout=120)  # fmt: skip
    counted = re.search(r"^\s+requests\s+(\d+)\s+\((\d+) ok, (\d+) failed", out, re.M)
    if counted is None or "TTFT      ms    p50" not in out:
        raise Failed(f"the demo printed no summary:\n{out}")
    total, ok, failed = map(int, counted.groups())
    if total == 0 or ok != total or failed != 0:
        raise Failed(f"the demo's summary: {total} requests, {ok} ok, {failed} failed:\n{out}")
    say(f"  `{run}`: {total} requests, all ok")


def check_serve(venv: Venv, logs: Path) -> None:
    """`llmobs serve` in front of `llmobs sim`: one real streamed request, seen in /metrics."""
    engine, proxy, metrics_port = free_port(), free_port(), free_port()
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    with processes(venv, logs) as running:
        running.start("sim", ["llmobs", "sim", "--port", str(engine)])
        running.start("serve", ["llmobs", "serve", "--upstream", f"http://127.0.0.1:{engine}",
                                "--host", "127.0.0.1", "--port", str(proxy),
                                "--metrics-port", str(metrics_port)])  # fmt: skip
        wait_for(f"http://127.0.0.1:{metrics_port}/readyz", running)
        tokens = stream_one_chat(f"http://127.0.0.1:{proxy}")
        text = scrape(metrics)
        ok = [v for labels, v in samples(text, "llmobs_requests_total") if 'outcome="ok"' in labels]
        ttft = samples(text, "gen_ai_server_time_to_first_token_seconds_count")
        if ok != [1.0] or [v for _, v in ttft] != [1.0] or tokens == 0:
            raise Failed(f"one request streamed ({tokens} tokens), /metrics counted ok={ok}, "
                         f"TTFT={ttft}")  # fmt: skip
    say(f"  `llmobs serve` in front of `llmobs sim`: {tokens} tokens streamed, counted once")


def install_and_check(venv: Venv, install: str, logs: Path) -> None:
    say(f"  {install}")
    venv.shell(install, ROOT)
    help_text = venv.shell("llmobs --help", ROOT)
    for command in ("serve", "sim", "demo"):
        if command not in help_text:
            raise Failed(f"`llmobs --help` lists no {command}:\n{help_text}")
    check_demo(venv, readme_first_command()[1])
    check_serve(venv, logs)


def readme(work: Path) -> None:
    install, _ = readme_first_command()
    say("the README's first command, in a new virtual environment")
    install_and_check(Venv.create(work, "readme"), install, work)


def lowest(work: Path) -> None:
    say("the runtime dependencies at their lowest allowed versions (uv, lowest-direct)")
    venv = Venv.create(work, "lowest")
    install = f"{shlex.quote(sys.executable)} -m uv pip install -q --resolution lowest-direct ."
    install_and_check(venv, install, work)


# --- the container and the stacks built on it ------------------------------------------------


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


def container(work: Path) -> None:
    image = Image.read()
    say(f"the container's install: {image.install} from what the Dockerfile copies")
    if image.python != f"{sys.version_info.major}.{sys.version_info.minor}":
        raise Failed(f"the image's Python is {image.python}; this check runs {PYTHON}")
    if image.install != "pip install .":
        raise Failed(f"the Dockerfile installs with {image.install!r}, not `pip install .`")
    venv = Venv.create(work, "container")
    venv.shell(image.install, stage(image, work))
    venv.shell(shlex.join([*image.entrypoint, "--help"]), work)
    rendered = work / "cpu-sim.yaml"
    kustomize = ["kubectl", "kustomize", str(ROOT / "deploy/kubernetes/overlays/cpu-sim")]
    rendered.write_text(
        subprocess.run(kustomize, capture_output=True, text=True, check=True).stdout
    )
    run_stack(venv, "compose", compose_stack(image), work)
    run_stack(venv, "kubernetes cpu-sim", kubernetes_stack(image, rendered), work)
    docker(image)


def docker(image: Image) -> None:
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        say("  no Docker daemon answers here: the image itself was not built")
        return
    subprocess.run(["docker", "build", "-q", "-t", "llmobs:pristine-check", str(ROOT)], check=True)
    out = subprocess.run(["docker", "run", "--rm", "llmobs:pristine-check", "--help"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode != 0 or "serve" not in out.stdout:
        raise Failed(f"`docker run llmobs --help` exited {out.returncode}:\n{out.stderr}")
    say("  the image builds and `docker run llmobs:pristine-check --help` answers")


CHECKS = {"readme": readme, "container": container, "lowest": lowest}


def main(argv: Sequence[str]) -> int:
    chosen = list(argv) or list(CHECKS)
    with tempfile.TemporaryDirectory(prefix="llmobs-pristine-") as tmp:
        for name in chosen:
            started = time.monotonic()
            try:
                CHECKS[name](Path(tmp))
            except (Failed, subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
                print(f"pristine: FAILED ({name}): {error}", file=sys.stderr)
                return 1
            say(f"{name}: passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
