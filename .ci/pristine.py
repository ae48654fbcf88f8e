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
parsers): `python .ci/pristine.py [readme|container|lowest ...]`. How it runs them is in
.ci/pristine_processes.py (environments, processes, HTTP), how it reads the container and its
stacks in .ci/pristine_stacks.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pristine_processes import (
    ROOT,
    Failed,
    Venv,
    free_port,
    processes,
    samples,
    say,
    scrape,
    stream_one_chat,
    wait_for,
)
from pristine_stacks import Image, compose_stack, kubernetes_stack, run_stack, stage

PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"


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


IMAGE_INSTALL = "pip install ."  # the image's install, as a user's


def container(work: Path) -> None:
    image = Image.read()
    say(f"the container's install: {image.install} from what the Dockerfile copies")
    if image.python != f"{sys.version_info.major}.{sys.version_info.minor}":
        raise Failed(f"the image's Python is {image.python}; this check runs {PYTHON}")
    if image.install != IMAGE_INSTALL:
        raise Failed(f"the Dockerfile installs with {image.install!r}, not `{IMAGE_INSTALL}`")
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
