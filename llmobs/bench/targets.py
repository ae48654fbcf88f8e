"""Starting and stopping what the bench measures: the sim, and each target in front of it.

Every party is a process of its own: the simulated engine (``llmobs sim --stamp``),
and one target at a time in front of it: ``llmobs serve`` instrumented, ``llmobs serve
--no-instrument``, nginx (the plain-C baseline: a generated config, ``proxy_buffering
off``, a keep-alive upstream pool, one worker, ``daemon off``, every path in a temp dir) or the
LiteLLM proxy (a config with one model on the sim's ``/v1``). ``direct`` is no process: the
client talks to the sim.

Each process is pinned to its own cores (``Pinning``), by setting the calling thread's
affinity before the fork so that the child and all its own children inherit it. ``Launcher``
owns every process it started and stops them all on ``close()`` (SIGTERM, then SIGKILL), so
the bench leaves nothing behind on an error or a Ctrl-C.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TARGETS = ("direct", "nginx", "llmobs", "llmobs-bare", "litellm")
START_TIMEOUT = 60.0  # LiteLLM takes ~10 s to import


class TargetUnavailable(RuntimeError):
    """The target cannot run here (not installed); the bench skips it with this note."""


@dataclass(frozen=True)
class Pinning:
    """CPU sets for the engine, the client (this process) and the target; None: not pinned."""

    engine: frozenset[int] | None
    client: frozenset[int] | None
    target: frozenset[int] | None

    def describe(self) -> str:
        def cpus(s: frozenset[int] | None) -> str:
            return ",".join(map(str, sorted(s))) if s else "any"

        return f"engine cpu {cpus(self.engine)}, client cpu {cpus(self.client)}, " \
               f"target cpu {cpus(self.target)}"  # fmt: skip


def plan_pinning(cpus: Sequence[int], enabled: bool = True) -> Pinning:
    """Three cores or more: one each. Two: engine and client share one, the target has the
    other (the figures are the target's). One, or disabled: no pinning."""
    c = sorted(cpus)
    if not enabled or len(c) < 2:
        return Pinning(None, None, None)
    if len(c) == 2:
        return Pinning(frozenset(c[:1]), frozenset(c[:1]), frozenset(c[1:]))
    return Pinning(frozenset(c[:1]), frozenset(c[1:2]), frozenset(c[2:3]))


@contextlib.contextmanager
def affinity(cpus: frozenset[int] | None) -> Iterator[None]:
    """Run the block (a fork) on ``cpus``: the child inherits the calling thread's mask."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def free_port() -> int:
    """An ephemeral loopback port that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Started:
    """A running party: its base URL, its process (None for direct), its /metrics URL."""

    name: str
    url: str
    proc: subprocess.Popen[bytes] | None = None
    metrics_url: str | None = None
    log: Path | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None


def nginx_config(workdir: Path, listen: int, upstream: int) -> str:
    """nginx as a pure streaming relay: nothing buffered, upstream connections kept alive."""
    user = f"user {getpass.getuser()};\n" if os.geteuid() == 0 else ""
    return f"""{user}daemon off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body;
  proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fastcgi;
  uwsgi_temp_path {workdir}/uwsgi;
  scgi_temp_path {workdir}/scgi;
  keepalive_requests 1000000;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 4096; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{listen};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"""


def litellm_config(upstream: int, model: str) -> str:
    """One model on the sim's OpenAI-compatible API; unknown parameters passed through."""
    return f"""model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: http://127.0.0.1:{upstream}/v1
      api_key: none
litellm_settings:
  drop_params: true
"""


class Launcher:
    """Starts the sim and the targets, pinned, logging to ``workdir``; ``close()`` stops all."""

    def __init__(
        self, workdir: Path, pinning: Pinning, nginx: str | None = None,
        litellm: str | None = None, python: str = sys.executable, llmobs_root: Path | None = None,
    ) -> None:  # fmt: skip
        self.workdir = workdir
        self.pinning = pinning
        self.nginx = nginx if nginx is not None else shutil.which("nginx")
        self.litellm = litellm if litellm is not None else shutil.which("litellm")
        self.python = python
        self.llmobs_root = llmobs_root or ROOT  # where the llmobs targets import llmobs from
        self._procs: list[subprocess.Popen[bytes]] = []
        self._count = 0

    def unavailable(self, target: str) -> str | None:
        """Why ``target`` cannot run here, or None."""
        if target == "nginx" and not self.nginx:
            return "nginx not found on PATH (apt-get install nginx)"
        if target == "litellm" and not self.litellm:
            return "litellm not found (pip install 'litellm[proxy]', or --litellm PATH)"
        if target not in TARGETS:
            return f"unknown target (known: {', '.join(TARGETS)})"
        return None

    def _spawn(
        self, name: str, argv: list[str], cpus: frozenset[int] | None,
        env: dict[str, str] | None = None,
    ) -> tuple[subprocess.Popen[bytes], Path]:  # fmt: skip
        self._count += 1
        log = self.workdir / f"{self._count:03d}-{name}.log"
        with log.open("wb") as out, affinity(cpus):
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, env=env, start_new_session=True,
            )  # fmt: skip
        self._procs.append(proc)
        return proc, log

    def _llmobs(self, *args: str) -> list[str]:
        return [self.python, "-m", "llmobs", *args]

    def _env(self, root: Path = ROOT) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH")
        return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else str(root)}

    def sim(self, flags: Sequence[str]) -> Started:
        """The simulated engine, stamping every token (``--stamp``)."""
        port = free_port()
        # booleans with a value ("--stamp true"): what every version's CLI takes, and
        # --llmobs-root may run an older tree than this one
        argv = self._llmobs("sim", "--host", "127.0.0.1", "--port", str(port), "--stamp", "true",
                            *flags)  # fmt: skip
        proc, log = self._spawn("sim", argv, self.pinning.engine, self._env())
        url = f"http://127.0.0.1:{port}"
        return Started("sim", url, proc, url + "/metrics", log)

    def target(self, name: str, upstream: str, model: str) -> Started:
        """Start ``name`` in front of ``upstream`` (``direct``: nothing to start)."""
        if why := self.unavailable(name):
            raise TargetUnavailable(why)
        if name == "direct":
            return Started(name, upstream)
        up_port = int(upstream.rsplit(":", 1)[1])
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cpus = self.pinning.target
        if name in ("llmobs", "llmobs-bare"):
            mport = free_port()
            argv = self._llmobs(
                "serve", "--upstream", upstream, "--host", "127.0.0.1", "--port", str(port),
                "--metrics-host", "127.0.0.1", "--metrics-port", str(mport),
                "--gpu-sample-interval", "0", "--engine-scrape-interval", "0",
                "--log-level", "warning", "--instrument", str(name == "llmobs").lower(),
            )  # fmt: skip
            proc, log = self._spawn(name, argv, cpus, self._env(self.llmobs_root))
            return Started(name, url, proc, f"http://127.0.0.1:{mport}/metrics", log)
        if name == "nginx":
            conf = self.workdir / f"nginx-{port}.conf"
            conf.write_text(nginx_config(self.workdir, port, up_port))
            assert self.nginx is not None
            argv = [self.nginx, "-p", str(self.workdir), "-c", str(conf)]
            proc, log = self._spawn(name, argv, cpus)
            return Started(name, url, proc, None, log)
        conf = self.workdir / f"litellm-{port}.yaml"
        conf.write_text(litellm_config(up_port, model))
        assert self.litellm is not None
        env = {
            **os.environ,
            # local only: no master key, no network lookups (tokenizers, cost map)
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HF_HUB_OFFLINE": "1",
            "LITELLM_LOG": "ERROR",
        }
        argv = [self.litellm, "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
                "--num_workers", "1"]  # fmt: skip
        proc, log = self._spawn(name, argv, cpus, env)
        return Started(name, url, proc, None, log)

    def stop(self, started: Started) -> None:
        """Stop one party (SIGTERM, then SIGKILL after 10 s) and its process group."""
        if started.proc is not None:
            _stop(started.proc)
            with contextlib.suppress(ValueError):
                self._procs.remove(started.proc)

    def close(self) -> None:
        """Stop everything still running, newest first."""
        while self._procs:
            _stop(self._procs.pop())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: workers too
        deadline = time.monotonic() + 10.0
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # a group leader gone may leave children (nginx workers exit with their master)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def log_tail(started: Started, size: int = 2000) -> str:
    """The end of a party's log, for error messages."""
    if started.log is None or not started.log.exists():
        return ""
    return started.log.read_text(errors="replace")[-size:]
