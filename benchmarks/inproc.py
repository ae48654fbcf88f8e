"""In-process relay benchmark: the whole request path on one event loop, for A/B comparisons.

Not a test: run it by hand and record what it says in docs/benchmarks.md. On a shared, noisy
machine (ours: two cores under KVM, whose speed varies 1.5-2x within hours) time figures of two
trees taken minutes apart disagree by more than most changes to the hot path; this gives two
kinds of figures that hold still:

- ``time``: process CPU per request of a closed loop run through the sidecar, min and median
  of ``--runs`` (take pairs of trees in turn, several times, and compare the minimums);
- ``instructions`` (needs valgrind): user-space instructions per request, counted by callgrind
  for two request counts and differenced, so start-up and imports drop out. Deterministic to
  about 1 %, blind to the kernel, caches and I/O waits: what the Python code costs.

One process holds three parties on one uvloop: a raw upstream protocol that answers each
request with a vLLM-shaped SSE stream in chunked framing, one token event per write, one
write per loop iteration (so each token is its own network read, as from a real engine); the
sidecar's ``app.Proxy`` (instrumented or ``--no-instrument``); and a raw client protocol
running ``--streams`` keep-alive connections in a closed loop. Everything but the sidecar is a
few lines, the same for every tree, so differences between trees are the sidecar's.

    python benchmarks/inproc.py time --tokens 4 --requests 3000
    python benchmarks/inproc.py instructions --tokens 4,64 --root /tmp/other-tree
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

EVENT = (
    b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk",'
    b'"created":1700000000,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
)
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    b"date: Mon, 23 Nov 2026 00:00:00 GMT\r\nserver: uvicorn\r\n\r\n"
)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":64}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)


_LENGTH = re.compile(rb"(?i)content-length: *(\d+)")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Upstream(asyncio.Protocol):
    """Answers each request with ``tokens`` events, one write per loop iteration."""

    def __init__(self, tokens: int) -> None:
        self._tokens = tokens
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\r\n\r\n")) >= 0:
            found = _LENGTH.search(self._buf, 0, end)
            length = int(found.group(1)) if found else 0
            if len(self._buf) < end + 4 + length:
                return
            self._buf = self._buf[end + 4 + length :]
            self._respond()

    def _respond(self) -> None:
        transport = self._transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        last = self._tokens - 1
        middle = _chunk(EVENT)
        final = _chunk(EVENT) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"

        def step(k: int) -> None:
            if k >= last:
                transport.write(final)
            else:
                transport.write(middle)
                loop.call_soon(step, k + 1)

        transport.write(HEAD + _chunk(EVENT))
        loop.call_soon(step, 1)


class _Client(asyncio.Protocol):
    """One keep-alive connection of the closed loop: the next request when one ends."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._next()

    def _next(self) -> None:
        state = self._state
        if state["left"] <= 0:
            state["idle"] += 1
            if state["idle"] == state["streams"]:
                state["done"].set_result(None)
            return
        state["left"] -= 1
        self._buf = b""
        assert self._transport is not None
        self._transport.write(REQUEST)

    def data_received(self, data: bytes) -> None:
        # only the tail is kept: a response's end is in its last 40 bytes, and a growing
        # buffer would make the client's cost per chunk grow with the response's length
        buf = self._buf[-64:] + data
        self._buf = buf
        if buf.endswith(b"0\r\n\r\n") and b"[DONE]" in buf[-40:]:
            self._next()


class _Probe:
    """Observation timed where it runs (``--probe``): every call into each request's observer
    is timed with ``perf_counter_ns`` around it, less the cost of timing an empty call.

    A difference of two whole-process figures (instrumented less bare) carries the noise of
    both, and this machine's drifts are as large as the cost; these sums hold only the
    observer's own calls, with the caches and branch history of the relay around them."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory
        self.traces = factory.traces
        self.chunk_ns = self.other_ns = self.chunks = self.requests = 0
        clock = time.perf_counter_ns
        samples = []
        for _ in range(20_000):
            a = clock()
            _noop()
            samples.append(clock() - a)
        samples.sort()
        self.empty_ns = samples[len(samples) // 2]  # the timing's own cost per call

    def __call__(self, *args: Any) -> _Timed:
        a = time.perf_counter_ns()
        obs = self.factory(*args)
        self.other_ns += time.perf_counter_ns() - a - self.empty_ns
        self.requests += 1
        return _Timed(obs, self)

    def reset(self) -> None:
        self.chunk_ns = self.other_ns = self.chunks = self.requests = 0


def _noop(*_: Any) -> None:
    return None


class _Timed:
    """One request's observer, every call timed into its ``_Probe``."""

    def __init__(self, obs: Any, probe: _Probe) -> None:
        self._obs = obs
        self._probe = probe

    def chunk(self, t_ns: int, data: bytes) -> None:
        a = time.perf_counter_ns()
        self._obs.chunk(t_ns, data)
        probe = self._probe
        probe.chunk_ns += time.perf_counter_ns() - a - probe.empty_ns
        probe.chunks += 1

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._obs, name)
        probe = self._probe

        def timed(*args: Any) -> Any:
            a = time.perf_counter_ns()
            result = method(*args)
            probe.other_ns += time.perf_counter_ns() - a - probe.empty_ns
            return result

        return timed


async def _run(
    instrument: bool, tokens: int, requests: int, streams: int, runs: int, probe: bool = False
) -> list[float]:
    """CPU microseconds per request of each run (after a warm-up run)."""
    from llmobs.app import Proxy  # noqa: PLC0415 - from the tree under test (sys.path)

    # The tree under test may predate the packages by stage (A/B across that change).
    try:
        from llmobs.config.settings import Settings  # noqa: PLC0415
        from llmobs.export.telemetry import build_telemetry  # noqa: PLC0415
    except ImportError:
        from llmobs.telemetry import build_telemetry  # noqa: PLC0415

        from llmobs.config import Settings  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    upstream = await loop.create_server(lambda: _Upstream(tokens), "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    settings = Settings(
        upstream=f"http://127.0.0.1:{port}", host="127.0.0.1", port=0,
        metrics_host="127.0.0.1", metrics_port=0, instrument=instrument,
    )  # fmt: skip
    proxy = Proxy(settings, build_telemetry())
    proxy_port = await proxy.start("127.0.0.1", 0)
    timed = None
    if probe:
        relay = proxy.relay
        assert relay is not None and relay._new_observer is not None, "--probe: instrumented"
        timed = relay._new_observer = _Probe(relay._new_observer)

    async def closed_loop(count: int) -> None:
        state: dict[str, Any] = {
            "left": count, "idle": 0, "streams": streams, "done": loop.create_future(),
        }  # fmt: skip
        transports = []
        for _ in range(streams):
            transport, _ = await loop.create_connection(
                lambda: _Client(state), "127.0.0.1", proxy_port
            )
            transports.append(transport)
        await state["done"]
        for transport in transports:
            transport.close()

    await closed_loop(streams * 4)  # warm: pools, label sets, templates
    gc.freeze()  # as llmobs serve does once started
    per_request = []
    for _ in range(runs):
        if timed is not None:
            timed.reset()
        start = time.process_time()
        await closed_loop(requests)
        per_request.append((time.process_time() - start) / requests * 1e6)
        if timed is not None:
            print(
                f"observer, in place: {timed.chunk_ns / timed.chunks / 1e3:.3f} us per chunk, "
                f"{timed.other_ns / timed.requests / 1e3:.1f} us per request besides "
                f"(the timing's own {timed.empty_ns} ns per call taken off)"
            )
    await proxy.stop(0)
    upstream.close()
    return per_request


def _serve(args: argparse.Namespace) -> None:
    """Run the load in this process (``time``, and each callgrind child)."""
    sys.path.insert(0, str(Path(args.root).resolve()))
    import uvloop  # noqa: PLC0415 - the sidecar's default loop

    instrument = args.instrument == "true"
    result = uvloop.run(
        _run(instrument, args.tokens, args.requests, args.streams, args.runs, args.probe)
    )
    result.sort()
    print(f"{min(result):.1f} {result[len(result) // 2]:.1f}")


def _instructions(args: argparse.Namespace, tokens: int, requests: int) -> int:
    """Instructions callgrind counts for a child serving ``requests`` of ``tokens``."""
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        # the interpreter as invoked: a virtual environment's (a link) keeps its packages
        sys.executable, __file__, "serve", "--root", args.root,
        "--instrument", args.instrument, "--tokens", str(tokens), "--requests", str(requests),
        "--streams", str(args.streams), "--runs", "1",
    ]  # fmt: skip
    # fixed string hashes (dict probes vary with the seed) and no BLAS threads spinning
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"no count from callgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("time", "instructions", "serve"))
    parser.add_argument("--root", default=str(ROOT), help="the tree to measure [this one]")
    parser.add_argument("--instrument", choices=("true", "false"), default="true")
    parser.add_argument("--tokens", default="4", help="tokens per response (instructions: a,b)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--pair", default="200,600",
        help="instructions: the two request counts differenced (more: less start-up noise)",
    )  # fmt: skip
    parser.add_argument(
        "--probe", action="store_true", help="time: also time each call into the observers"
    )
    args = parser.parse_args()
    if args.mode == "serve":
        args.tokens = int(args.tokens)
        _serve(args)
        return
    if args.mode == "time":
        args.tokens = int(args.tokens)
        label = "instrumented" if args.instrument == "true" else "bare"
        sys.stdout.write(f"{label}, {args.tokens} tokens, CPU us per request (min median): ")
        sys.stdout.flush()
        _serve(args)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("instructions: valgrind is not installed (apt-get install valgrind)")
    counts = [int(t) for t in args.tokens.split(",")]
    # requests: the difference removes start-up and imports (which vary by ~1M instructions
    # from run to run: the larger the difference, the less of that per request)
    small, large = (int(n) for n in args.pair.split(","))
    per_request = {}
    for tokens in counts:
        a = _instructions(args, tokens, small)
        b = _instructions(args, tokens, large)
        per_request[tokens] = (b - a) / (large - small)
        print(f"{tokens} tokens: {per_request[tokens]:,.0f} instructions per request")
    if len(counts) == 2:
        (t1, i1), (t2, i2) = sorted(per_request.items())
        per_chunk = (i2 - i1) / (t2 - t1)
        fixed = i1 - t1 * per_chunk
        print(f"per chunk {per_chunk:,.0f}, per request without its chunks {fixed:,.0f}")


if __name__ == "__main__":
    main()
