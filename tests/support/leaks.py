"""Leak checks for loopback tests: open fds, asyncio tasks and RSS of this very process, and
reference cycles among llmobs's objects."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass


def open_fds(pid: int | str = "self") -> int:
    """File descriptors open in a process (Linux ``/proc``)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process, from ``/proc/<pid>/status``."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")  # pragma: no cover - not Linux


@dataclass(frozen=True)
class Usage:
    fds: int
    tasks: int

    @classmethod
    def now(cls) -> Usage:
        return cls(open_fds(), len(asyncio.all_tasks()))


async def back_to(baseline: Usage, within: float = 5.0) -> None:
    """Wait until fds and tasks are no more than at ``baseline``; fail naming the excess."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        now = Usage.now()
        if now.fds <= baseline.fds and now.tasks <= baseline.tasks:
            return
        if loop.time() > deadline:
            tasks = [t.get_coro() for t in asyncio.all_tasks()]
            raise AssertionError(f"leak: {now} after, {baseline} before; tasks {tasks}")
        await asyncio.sleep(0.02)


def _ours(obj: object) -> bool:
    """Whether ``obj`` is llmobs's: an instance of, or a function from, ``llmobs``."""
    module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    return isinstance(module, str) and module.startswith("llmobs")


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[list[object]]:
    """llmobs's objects that only the cycle collector frees, made while the block runs: the
    list, filled when the block ends. Cyclic garbage waits for the collector, whose passes
    over everything young stall the loop (docs/benchmarks.md)."""
    found: list[object] = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(o for o in gc.garbage if _ours(o))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
