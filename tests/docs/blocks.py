"""The command blocks of README.md and docs/*.md, read with pytest-codeblocks' parser, and a
runner that types them into bash as a reader would.

A block runs as written, in a copy of the checkout (one per document, so a document's blocks
are one walkthrough: a file one block writes, the next one reads). What a block needs to run
here is said in an HTML comment on the line before it, which readers do not see:

- ``<!--pytest.mark.skip(reason="...")-->``: it cannot run here (docker, a GPU, a cluster, a
  long benchmark), and the reason says which test covers it instead;
- ``<!--pytest.mark.docs(...)-->`` with keywords:
  ``services=True``: each command is a server that runs until stopped: it is started in the
  background, ``ready`` URLs must answer, and every one must still be up a second later;
  ``stand_in={"vllm serve": "llmobs sim --port 8000"}``: a command that needs what is not
  here (a GPU engine) is replaced by one that serves the same API on the same port;
  ``before="..."``: bash run first (a stand-in engine, a request), not shown to readers;
  ``ready=[URL, ...]``: URLs that must answer before the block's commands (or, with
  services, after them); ``writes="slo.yaml"``: the block is a file's content, written into
  the walkthrough's folder for the blocks after it; ``sample="name"``: the block is the output
  of a command (tests/docs/test_samples.py checks its shape); ``kubernetes="file.yaml"``: the
  block renders manifests into that file, which tests/deploy validates.

pytest-codeblocks' own runner is not used: it runs a block with no timeout, cannot start a
server and let it go, and has no way to write a block to a file.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pytest_codeblocks.main import extract_from_file

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELLS = ("bash", "sh")

PRELUDE = """\
set -euo pipefail
wait_http() {  # wait_http URL: until it answers 2xx (30 s at most)
  for _ in $(seq 300); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "docs runner: $1 never answered" >&2; return 1
}
services=()
engine() {  # the simulated engine on the engine's usual port, for blocks that front an engine
  llmobs sim --port 8000 & wait_http http://127.0.0.1:8000/health
}
sidecar() {  # a sidecar in front of it, with the defaults a reader's `llmobs serve` has
  llmobs serve --upstream http://127.0.0.1:8000 "$@" & wait_http http://127.0.0.1:9464/readyz
}
chats() {  # chats N: N streamed chat requests through the sidecar
  for _ in $(seq "$1"); do
    curl -fsS -o /dev/null http://127.0.0.1:8080/v1/chat/completions \\
      -H 'Content-Type: application/json' -d '{"model": "sim-llama-3-8b", "max_tokens": 8,
      "stream": true, "messages": [{"role": "user", "content": "hello"}]}'
  done
}
"""


@dataclass(frozen=True)
class Block:
    """One fenced block of a document: where it is, its language, its text, its marks."""

    doc: Path
    line: int
    syntax: str
    code: str
    marks: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def options(self) -> dict[str, Any]:
        """The keywords of its ``pytest.mark.docs(...)``, if it has one."""
        for mark in self.marks:
            if mark.startswith("pytest.mark.docs("):
                decorator = eval(mark, {"pytest": pytest})  # as pytest-codeblocks reads marks
                return dict(decorator.kwargs)
        return {}

    def param(self) -> Any:
        marks = [eval(m, {"pytest": pytest, "sys": sys}) for m in self.marks]
        return pytest.param(self, marks=marks, id=self.name)


def blocks(doc: Path) -> list[Block]:
    return [
        Block(doc, b.lineno, b.syntax or "", b.code, tuple(b.marks)) for b in extract_from_file(doc)
    ]


def every_block() -> list[Block]:
    return [block for doc in DOCUMENTS for block in blocks(doc)]


def commands(code: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n", " ", code)
    lines = [line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
             for line in joined.splitlines()]  # fmt: skip
    return [line for line in lines if line.strip()]


def script(block: Block) -> str:
    """The bash a reader's typing amounts to, with the block's marks applied."""
    options = block.options()
    code = block.code
    for prefix, replacement in options.get("stand_in", {}).items():
        code = re.sub(rf"^{re.escape(prefix)}.*$", replacement, code, flags=re.M)
    out = [PRELUDE, options.get("before", "")]
    ready = [f"wait_http {url}" for url in options.get("ready", [])]
    if options.get("services"):
        out += [f"{line} &\nservices+=($!)" for line in commands(code)]
        out += [*ready, "sleep 1"]
        out.append(
            'for pid in "${services[@]}"; do kill -0 "$pid" 2>/dev/null'
            ' || { echo "docs runner: a server of this block exited" >&2; exit 1; }; done'
        )
    else:
        out += [*ready, code]
    return "\n".join(out) + "\n"


@dataclass
class Walkthrough:
    """A copy of the checkout that one document's blocks run in, in order."""

    folder: Path

    @classmethod
    def create(cls, base: Path, doc: Path) -> Walkthrough:
        folder = base / doc.stem
        if not folder.exists():
            shutil.copytree(
                ROOT,
                folder,
                ignore=shutil.ignore_patterns(
                    ".git", ".venv", "__pycache__", "*_cache", ".hypothesis", "build", "*.egg-info"
                ),
            )
        return cls(folder)

    def run(self, block: Block, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        options = block.options()
        if "writes" in options:
            (self.folder / options["writes"]).write_text(block.code)
            return subprocess.CompletedProcess([], 0, "", "")
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        # Output to files, not pipes: the servers a block leaves running hold what they inherit.
        log = self.folder / ".docs-runner.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                ["bash", "-c", script(block)], cwd=self.folder, env=env, text=True,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = -1
            finally:
                stop_group(proc.pid)
        output = log.read_text(errors="replace")
        if code == -1:
            output += f"\ndocs runner: still running after {timeout:.0f} s"
        return subprocess.CompletedProcess(proc.args, code, output, "")


def stop_group(pgid: int) -> None:
    """End what the block left running (its servers), as Ctrl-C and closing the shell would."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        for _ in range(50):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
