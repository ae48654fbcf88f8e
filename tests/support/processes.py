"""llmobs processes a test starts as a pod would run them (the sidecar, the sim standing in
for the engine), and stops together."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Processes:
    """``python -m llmobs ...`` processes, terminated and awaited by ``stop``."""

    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []

    async def spawn(self, argv: tuple[str, ...], env: dict[str, str], log: Path | None) -> None:
        """One more, its output into ``log`` (None: nowhere)."""
        out = log.open("wb") if log is not None else None
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llmobs", *argv, cwd=ROOT, env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out if out is not None else asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.STDOUT if out is not None else asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            if out is not None:
                out.close()
        self.procs.append(proc)

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs:
            await proc.wait()
