"""What a target costs, read from ``/proc``: CPU time (and the kernel's share of it) and
resident memory of a process tree.

A target may be several processes (nginx: a master and its worker; LiteLLM: a server and
its workers), so each figure is summed over the process and its descendants, found through
``/proc/<pid>/task/<tid>/children``. Linux only; the bench says so and skips these figures
elsewhere.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_PROC = Path("/proc")


def available() -> bool:
    """Whether this system has a Linux-style /proc to read."""
    return (_PROC / "self" / "stat").exists()


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in (_PROC / str(current) / "task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue  # gone meanwhile
    return out


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds used so far by ``pids``, to the nanosecond where the kernel says.

    ``/proc/<pid>/task/<tid>/schedstat`` (time on CPU, ns, per thread) where there is one;
    else ``utime + stime`` from ``/proc/<pid>/stat``, in clock ticks (10 ms: too coarse for a
    cell of a few seconds at one stream). Threads that ended are not counted by the former.
    """
    total = 0.0
    for pid in pids:
        try:
            tasks = list((_PROC / str(pid) / "task").iterdir())
            total += sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9
        except (OSError, ValueError, IndexError):
            total += _stat_seconds([pid])
    return total


def _stat_seconds(pids: list[int]) -> float:
    user, system = cpu_times(pids)
    return user + system


def cpu_times(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds used so far by ``pids`` (``utime``, ``stime`` of
    ``/proc/<pid>/stat``, every thread of each process, in clock ticks of 10 ms): what share
    of a target's CPU the kernel spends on its behalf. A relay's system calls are the same
    whatever it is written in, so its user time is where relays differ (docs/benchmarks.md).
    """
    user = system = 0
    for pid in pids:
        try:
            fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11])
        system += int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def system_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The kernel's share of the CPU used between two ``cpu_times``; NaN if none was."""
    user, system = after[0] - before[0], after[1] - before[1]
    return system / (user + system) if user + system > 0 else math.nan


def rss_bytes(pids: list[int]) -> int:
    """Resident set size (``VmRSS``) of ``pids``, summed."""
    total = 0
    for pid in pids:
        try:
            text = (_PROC / str(pid) / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                break
    return total
