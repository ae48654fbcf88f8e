"""Ports for tests that need one before, or outside, the server that will use it, without a
race: a port picked, closed and bound later can be taken meanwhile by any socket on the
machine (another test's server bound to port 0, an outgoing connection's source port).

- ``free_port``: for a process that must be told its port (Prometheus, llama-server): one
  below the kernel's ephemeral range, which neither a bind to port 0 nor a connection ever
  takes; only another explicit pick of the same number could.
- ``refused_port``: an address where nothing listens, held for the block (a socket bound
  and not listening refuses every connection, and no other socket can bind its port).
- ``listening``: our own processes bind port 0 and say which port they got.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

from tests.support import ROOT

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # below: the well-known and registered services' ports


def _picks() -> range:
    """The ports to pick from: below the ephemeral range where it leaves room (Linux's
    default starts at 32768), else above it."""
    try:
        low, high = map(int, EPHEMERAL.read_text().split())
    except (OSError, ValueError):  # not Linux: its usual ephemeral range, 49152-65535
        low, high = 49152, 65535
    if low - LOWEST >= 1000:
        return range(LOWEST, low)
    return range(high + 1, 65536) if high < 64535 else range(LOWEST, 65536)


def free_port() -> int:
    """A loopback port nothing is bound to now, outside the ephemeral range."""
    picks = _picks()
    rng = random.SystemRandom()  # not the tests' seeded generator: two runs pick apart
    for _ in range(100):
        port = rng.choice(picks)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {picks}")


@contextlib.contextmanager
def refused_port() -> Iterator[socket.socket]:
    """A loopback socket bound and not listening: a connection to its port is refused for
    the whole block. ``listen()`` on it (``aiohttp.web.SockSite``) brings a server up
    there. No ``SO_REUSEADDR``: no other socket can share the port meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


async def listening(
    *argv: str, pattern: str, env: Mapping[str, str] | None = None, within: float = 60.0
) -> tuple[asyncio.subprocess.Process, tuple[int, ...], str]:
    """``python -m llmobs ARGV``, told port 0, once it says where it listens (``pattern``'s
    groups: ``SERVE``, ``SIM``): the process (stderr joined to its stdout, a pipe), its
    ports, and what it wrote until then."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmobs", *argv, env=env, cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(within):
            while line := (await proc.stdout.readline()).decode(errors="replace"):
                lines.append(line)
                found = re.search(pattern, line)
                if found is not None:
                    return proc, tuple(map(int, found.groups())), "".join(lines)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    await proc.wait()
    raise AssertionError(
        f"llmobs {argv[0]} ended without saying where it listens:\n{''.join(lines)}"
    )


# what ``llmobs serve`` (its proxy's and metrics' ports) and ``llmobs sim`` say once listening
SERVE = r"proxy on [^ ]+:(\d+).* -> .*; metrics on https?://[^ ]+:(\d+)/metrics"
SIM = r"llmobs sim: listening on https?://[^ ]+:(\d+)"


@contextlib.asynccontextmanager
async def running(
    *argv: str, pattern: str, env: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[int, ...]]:
    """``python -m llmobs ARGV`` (told port 0) until the block ends, its ports yielded and its
    output drained (the sim logs every request: an undrained pipe would stop it)."""
    proc, ports, _ = await listening(*argv, pattern=pattern, env=env)
    assert proc.stdout is not None
    drain = asyncio.ensure_future(proc.stdout.read())
    try:
        yield ports
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
        await drain
