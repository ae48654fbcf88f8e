"""Fairness under attack: how much one hostile party delays everyone else's stream.

Not a test (``tests/e2e/test_hostile.py`` runs a short version of it and asserts on its JSON
report): run it by hand and record the figures in docs/benchmarks.md with the machine they
came from.

Four processes: a paced engine (raw asyncio), the sidecar (``llmobs serve``), one hostile
party, and this driver, which holds ``--victims`` steady streams through the sidecar. The
engine stamps every token event with the monotonic clock (system-wide on Linux) as it writes
it, and the driver takes each event's delay as its arrival time minus that stamp: the time
the event spent in the sidecar (and on loopback). It is measured first with no attack (the
baseline), then while the hostile party does, as fast as loopback carries it, one of:

- ``tiny-chunks``: uploads a chunked request body of 1-byte chunks (``1\\r\\nx\\r\\n``), as
  large as ``--max-body-bytes`` allows (the probe's main defect: 100 MB of framing);
- ``chunk-ext``: the same with a short chunk extension on every chunk (``1;a=b``), which the
  strict size-line grammar checks;
- ``trailers``: a one-byte body, then a trailer section of ``X:y`` lines without end;
- ``engine-tiny-chunks``: asks the engine for a response that it writes in 1-byte chunks,
  ``--flood-bytes`` of payload, as fast as it can (a broken or hostile engine);
- ``engine-tiny-events``: the same engine writes ``--flood-bytes`` of one-token SSE events in
  64 KiB chunks (a thousand events a chunk), which the observer parses one by one;
- ``pipeline``: a flood of pipelined small requests on one connection.

    python benchmarks/hostile.py                               # every attack, default limits
    python benchmarks/hostile.py --attacks tiny-chunks --json out.json

It prints, per attack: the victims' event delay (p50, p99, max) before and during the attack,
how long the attack ran, what the hostile party was answered, and the sidecar's CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = (
    "tiny-chunks",
    "chunk-ext",
    "trailers",
    "engine-tiny-chunks",
    "engine-tiny-events",
    "pipeline",
)
STAMP = b"t="  # the engine's send time, monotonic ns, in every token event


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the engine: paced token streams, and a 1-byte-chunk flood on request ---------------------
async def _engine_conn(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tpot: float, flood: int
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            path = head.split(b" ", 2)[1]
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            if path.startswith(b"/flood-events"):
                await _flood_events(writer, flood)
            elif path.startswith(b"/flood"):
                await _flood(writer, flood)
            elif path.startswith(b"/v1/chat/completions/stream"):
                await _paced(writer, tpot, int(path.rsplit(b"/", 1)[1] or b"0"))
            else:  # anything else (the hostile uploads): a one-event answer
                event = b'data: {"choices":[{"delta":{"content":"ok"}}]}\n\n'
                writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def _paced(writer: asyncio.StreamWriter, tpot: float, tokens: int) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(tokens):
        await asyncio.sleep(max(0.0, start + i * tpot - loop.time()))
        if writer.is_closing():
            return
        event = b'data: {"choices":[{"delta":{"content":" w"}}],"%b%d"}\n\n' % (
            STAMP,
            time.monotonic_ns(),
        )
        writer.write(b"%x\r\n%b\r\n" % (len(event), event))
    writer.write(b"0\r\n\r\n")


async def _flood(writer: asyncio.StreamWriter, payload: int) -> None:
    block = b"1\r\nx\r\n" * 65536
    left = payload
    while left > 0:
        n = min(left, 65536)
        writer.write(block[: n * 6])
        left -= n
        await writer.drain()
    writer.write(b"0\r\n\r\n")


async def _flood_events(writer: asyncio.StreamWriter, payload: int) -> None:
    event = b'data: {"choices":[{"index":0,"delta":{"content":" x"}}]}\n\n'
    chunk = event * (65536 // len(event))
    framed = b"%x\r\n%b\r\n" % (len(chunk), chunk)
    for _ in range(max(1, payload // len(chunk))):
        writer.write(framed)
        await writer.drain()
    writer.write(b"0\r\n\r\n")


def run_engine(port: int, tpot: float, flood: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _engine_conn(r, w, tpot, flood), "127.0.0.1", port, limit=1 << 20
        )
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# -- the hostile party ------------------------------------------------------------------------
def _body_blocks(attack: str, max_body: int) -> tuple[bytes, list[bytes]]:
    """The request head and the body's blocks for an upload attack: the worst body the limits
    allow, then some more (a sidecar that counts wire bytes refuses it at its limit)."""
    path = b"/v1/chat/completions"
    head = (
        b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" % path
    )
    if attack == "trailers":
        unit = b"X:y\r\n"
        first = b"1\r\nx\r\n0\r\n"
        total = max_body * 2
        block = unit * (1 << 16)
        return head, [first] + [block] * (total // len(block)) + [b"\r\n"]
    unit = b"1\r\nx\r\n" if attack == "tiny-chunks" else b"1;a=b\r\nx\r\n"
    # as many one-byte payloads as the decoded-size limit allows (what the old limit counted)
    count = max_body
    block = unit * (1 << 16)
    blocks = [block] * (count // (1 << 16))
    return head, [*blocks, unit * (count % (1 << 16)), b"0\r\n\r\n"]


def _send_all(sock: socket.socket, blocks: list[bytes]) -> int:
    sent = 0
    for block in blocks:
        try:
            sock.sendall(block)
        except OSError:
            break  # refused and closed: what a bounded sidecar does
        sent += len(block)
    return sent


def _read_status(sock: socket.socket, timeout: float) -> str:
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except OSError as exc:
        return type(exc).__name__
    return data.split(b"\r\n", 1)[0].decode("latin-1", "replace") or "closed"


def _upload(sock: socket.socket, attack: str, max_body: int) -> dict[str, object]:
    """A hostile body (tiny chunks, chunk extensions, endless trailers) sent as fast as taken."""
    head, blocks = _body_blocks(attack, max_body)
    sock.sendall(head)
    sent = len(head) + _send_all(sock, blocks)
    return {"bytes_sent": sent, "answer": _read_status(sock, 60)}


def _engine_flood(sock: socket.socket, attack: str) -> dict[str, object]:
    """Ask the engine for its flood (tiny chunks or tiny events) and read all of it."""
    path = b"/flood" if attack == "engine-tiny-chunks" else b"/flood-events/v1/chat/completions"
    body = b'{"model":"m","stream":true}'
    sock.sendall(
        b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (path, len(body), body)
    )
    got = 0
    sock.settimeout(60)
    while data := sock.recv(1 << 20):
        got += len(data)
        if data.endswith(b"0\r\n\r\n"):
            break
    return {"bytes_received": got, "answer": "read"}


def _pipeline(sock: socket.socket, deadline: float) -> dict[str, object]:
    """Pipelined small requests on one connection until ``deadline``, answers discarded."""
    block = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" * 4096
    sock.setblocking(False)
    sent = 0
    while time.monotonic() < deadline:
        try:
            sent += sock.send(block)
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:
            break
        _discard(sock)
    return {"bytes_sent": sent, "answer": "pipelined"}


def _discard(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 20):
            pass
    except (BlockingIOError, OSError):
        pass


def run_attack(attack: str, port: int, max_body: int, seconds: float) -> dict[str, object]:
    """One attack against the sidecar on ``port``; returns what happened."""
    start = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    result: dict[str, object] = {}
    if attack in ("tiny-chunks", "chunk-ext", "trailers"):
        result = _upload(sock, attack, max_body)
    elif attack in ("engine-tiny-chunks", "engine-tiny-events"):
        result = _engine_flood(sock, attack)
    elif attack == "pipeline":
        result = _pipeline(sock, start + seconds)
    sock.close()
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


# -- the victims ------------------------------------------------------------------------------
async def victim(port: int, tokens: int, delays: list[float], stop: asyncio.Event) -> None:
    """Stream after stream through the sidecar until ``stop``; each event's delay (ms)."""
    while not stop.is_set():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions/stream/%d HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}" % tokens
        )
        buf = b""
        while True:
            data = await reader.read(65536)
            now = time.monotonic_ns()
            if not data:
                break
            buf += data
            while (at := buf.find(STAMP)) >= 0:
                end = buf.find(b'"', at)
                if end < 0:
                    break
                delays.append((now - int(buf[at + 2 : end])) / 1e6)
                buf = buf[end:]
            if buf.endswith(b"0\r\n\r\n"):
                break
        writer.close()


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(ordered[len(ordered) // 2], 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max": round(ordered[-1], 2),
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class AttackReport:
    attack: str
    baseline_ms: dict[str, float]
    during_ms: dict[str, float]
    attack_result: dict[str, object]
    sidecar_cpu_s: float
    added_max_ms: float = 0.0


@dataclass
class Report:
    victims: int
    tpot_s: float
    max_body_bytes: int
    event_loop: str
    attacks: list[AttackReport] = field(default_factory=list)


async def measure(
    attack: str, port: int, sidecar_pid: int, args: argparse.Namespace
) -> AttackReport:
    tokens = 10_000

    async def window(seconds: float | None) -> tuple[list[float], dict[str, object]]:
        delays: list[float] = []
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(victim(port, tokens, delays, stop)) for _ in range(args.victims)
        ]
        await asyncio.sleep(0.5)  # the streams under way
        delays.clear()
        result: dict[str, object] = {}
        if seconds is not None:
            await asyncio.sleep(seconds)
        else:
            # in a process of its own: a thread would take the GIL from the victims' loop
            proc = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--role", "attack", "--attacks", attack,
                "--port", str(port), "--max-body-bytes", str(args.max_body_bytes),
                "--seconds", str(args.seconds), stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            result = json.loads(out)
            await asyncio.sleep(0.2)  # what the attack left behind, still measured
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return delays, result

    base, _ = await window(args.baseline)
    cpu = cpu_seconds(sidecar_pid)
    during, result = await window(None)
    report = AttackReport(
        attack,
        quantiles(base),
        quantiles(during),
        result,
        round(cpu_seconds(sidecar_pid) - cpu, 2),
    )
    report.added_max_ms = round(report.during_ms["max"] - report.baseline_ms["p50"], 2)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated")
    parser.add_argument("--victims", type=int, default=8, help="steady streams [8]")
    parser.add_argument("--tpot", type=float, default=0.015, help="seconds per token [0.015]")
    parser.add_argument("--max-body-bytes", type=int, default=16 * 1024**2)
    parser.add_argument("--flood-bytes", type=int, default=16 * 1024**2)
    parser.add_argument("--seconds", type=float, default=5.0, help="pipeline flood length [5]")
    parser.add_argument("--baseline", type=float, default=2.0, help="seconds [2]")
    parser.add_argument("--event-loop", default="auto", choices=("auto", "asyncio", "uvloop"))
    parser.add_argument("--json", type=Path, help="write the report here too")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "engine":
        run_engine(args.port, args.tpot, args.flood_bytes)
        return 0
    if args.role == "attack":
        print(json.dumps(run_attack(args.attacks, args.port, args.max_body_bytes, args.seconds)))
        return 0
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {sorted(unknown)} (known: {', '.join(ATTACKS)})")
    engine_port, port, metrics_port = free_port(), free_port(), free_port()
    engine = subprocess.Popen(
        [sys.executable, __file__, "--role", "engine", "--port", str(engine_port),
         "--tpot", str(args.tpot), "--flood-bytes", str(args.flood_bytes)]
    )  # fmt: skip
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "llmobs", "serve", "--upstream", f"http://127.0.0.1:{engine_port}",
         "--port", str(port), "--metrics-port", str(metrics_port),
         "--max-body-bytes", str(args.max_body_bytes), "--event-loop", args.event_loop,
         "--log-level", "error"],
        cwd=ROOT,
    )  # fmt: skip
    report = Report(args.victims, args.tpot, args.max_body_bytes, args.event_loop)
    try:
        _wait_port(port)
        _wait_port(engine_port)
        for attack in attacks:
            result = asyncio.run(measure(attack, port, sidecar.pid, args))
            report.attacks.append(result)
            print(_line(result), flush=True)
    finally:
        for proc in (sidecar, engine):
            proc.terminate()
            proc.wait(10)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0


def _line(r: AttackReport) -> str:
    b, d = r.baseline_ms, r.during_ms
    return (
        f"{r.attack:20s} delay ms before p50 {b['p50']:6.2f} p99 {b['p99']:6.2f} "
        f"max {b['max']:7.2f} | during p50 {d['p50']:6.2f} p99 {d['p99']:7.2f} "
        f"max {d['max']:8.2f} (n={d['n']}) | attack {r.attack_result.get('seconds')} s, "
        f"{r.attack_result.get('answer')!s}, sidecar CPU {r.sidecar_cpu_s} s"
    )


def _wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


if __name__ == "__main__":
    sys.exit(main())
