"""How the pristine checks (.ci/pristine.py) run what a user runs: empty virtual environments,
the processes started in them (all ended on exit, their logs shown on a failure), and the
plain HTTP a user's client speaks to them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
