"""CPU time from ``/proc`` (``bench.procfs``): the kernel's share of it."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import pytest

from llmobs.bench import procfs


@pytest.mark.skipif(not procfs.available(), reason="needs Linux /proc")
def test_the_kernels_share_of_cpu_tells_system_calls_from_computing() -> None:
    """``cpu_times``/``system_share`` on this process: a loop of arithmetic is user time,
    a loop of large reads from /dev/zero (the kernel fills the buffer) is system time."""
    pids = [os.getpid()]

    def share_of(work: Callable[[], object]) -> float:
        before = procfs.cpu_times(pids)
        deadline = time.process_time() + 0.3
        while time.process_time() < deadline:
            work()
        return procfs.system_share(before, procfs.cpu_times(pids))

    assert share_of(lambda: sum(range(10_000))) < 0.3
    with open("/dev/zero", "rb", buffering=0) as zero:
        assert share_of(lambda: zero.read(1 << 20)) > 0.7
    assert math.isnan(procfs.system_share((1.0, 2.0), (1.0, 2.0)))
