"""Fuzzing campaign for the parsers: a large run of what CI runs small.

Not a test: run it by hand and record the result in docs/benchmarks.md.

1. **hypothesis**: the properties of ``tests/unit/observe/test_fuzz.py`` (no exception escapes
   any decoder, dialect, request parser or usage stripper; any chunking gives the same result;
   buffers bounded) with ``--examples`` examples each instead of CI's few dozen.
2. **atheris** (coverage-guided libFuzzer; ``pip install atheris``, skipped when absent): for
   ``--atheris-seconds`` seconds, the fuzzer's bytes become a stream, a chunking and a line
   limit; the same properties are checked on the SSE and NDJSON decoders, every dialect fed
   what they decode, the request parser, ``inject_usage`` and the ``UsageStripper``.

    python benchmarks/fuzz.py --examples 4000 --atheris-seconds 240
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmobs.observe.dialects import ANTHROPIC, OLLAMA_CHAT, OPENAI_CHAT, RESPONSES, TGI, UNKNOWN  # noqa: E402
from llmobs.observe.dialects.anthropic import AnthropicStream  # noqa: E402
from llmobs.observe.dialects.base import (  # noqa: E402
    FINISH_REASONS,
    MAX_FINISH_REASONS,
    Dialect,
    Passthrough,
)
from llmobs.observe.dialects.base import loads as parse  # noqa: E402
from llmobs.observe.dialects.ollama import OllamaStream  # noqa: E402
from llmobs.observe.dialects.openai import OpenAIStream  # noqa: E402
from llmobs.observe.dialects.request import parse_request  # noqa: E402
from llmobs.observe.dialects.responses import ResponsesStream  # noqa: E402
from llmobs.observe.dialects.tgi import TgiStream  # noqa: E402
from llmobs.observe.framing import NdjsonDecoder, SseDecoder  # noqa: E402
from llmobs.relay.inject import UsageStripper, inject_usage  # noqa: E402

LIMITS = (8, 64, 4096)
DIALECTS: tuple[type[Dialect], ...] = (
    OpenAIStream, ResponsesStream, AnthropicStream, TgiStream, OllamaStream, Passthrough,
)  # fmt: skip


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def check(stream: bytes, cuts: list[int], limit: int) -> None:
    """Every property, on one stream; an AssertionError or any other exception is a finding."""
    pieces = split_at(stream, cuts)

    def sse(chunks: list[bytes]) -> tuple[list[Any], int]:
        decoder = SseDecoder(limit)
        events = []
        for chunk in chunks:
            events.extend(decoder.feed(chunk))
            held = decoder._tail_len + sum(len(d) + 1 for d in decoder._data)
            assert held <= 2 * limit, "SSE decoder buffer unbounded"
        events.extend(decoder.flush())
        return events, decoder.malformed

    def ndjson(chunks: list[bytes]) -> tuple[list[bytes], int]:
        decoder = NdjsonDecoder(limit)
        lines = []
        for chunk in chunks:
            lines.extend(decoder.feed(chunk))
            assert decoder._tail_len <= limit, "NDJSON decoder buffer unbounded"
        lines.extend(decoder.flush())
        return lines, decoder.malformed

    events, _ = sse([stream])
    assert sse(pieces) == (events, _), "SSE events depend on the chunking"
    lines, _ = ndjson([stream])
    assert ndjson(pieces) == (lines, _), "NDJSON lines depend on the chunking"

    payloads = [e.data for e in events] + lines + [stream]
    for kind in DIALECTS:
        dialect = kind()
        dialect.captured = []
        for payload in payloads:
            assert dialect.on_data(payload) >= 0
            try:
                obj = parse(payload)
            except ValueError:
                continue
            if isinstance(obj, dict):
                dialect.on_body(obj)
        assert all(0 <= k < 64 and v >= 0 for k, v in dialect.pending.items())
        assert set(dialect.finish_reasons) <= set(FINISH_REASONS)
        assert len(dialect.finish_reasons) <= MAX_FINISH_REASONS

    for route in (OPENAI_CHAT, RESPONSES, ANTHROPIC, TGI, OLLAMA_CHAT, UNKNOWN):
        parse_request(stream, route, capture=True)
    rewritten = inject_usage(stream)
    assert rewritten is None or json.loads(rewritten)["stream_options"]["include_usage"] is True

    def strip(chunks: list[bytes]) -> tuple[bytes, int]:
        stripper = UsageStripper(max_event=limit)
        out = b""
        for chunk in chunks:
            out += stripper.feed(chunk)
            assert len(stripper._buffer) <= limit, "usage stripper buffer unbounded"
        return out + stripper.flush(), stripper.stripped

    whole, stripped = strip([stream])
    assert strip(pieces) == (whole, stripped), "usage stripping depends on the chunking"
    assert stripped or whole == stream, "bytes changed with nothing stripped"


def atheris_worker(seconds: int) -> None:
    """Run inside its own process: libFuzzer owns it and exits when the time is up."""
    import atheris  # noqa: PLC0415 - optional: pip install atheris

    atheris.instrument_all()  # coverage of everything loaded: the parsers and what they call

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        limit = fdp.PickValueInList(list(LIMITS))
        cuts = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 12))]
        check(fdp.ConsumeBytes(fdp.remaining_bytes()), cuts, limit)

    corpus = ROOT / ".hypothesis" / "atheris-corpus"  # ignored by git, like hypothesis' own
    corpus.mkdir(parents=True, exist_ok=True)
    argv = [sys.argv[0], str(corpus), f"-max_total_time={seconds}", "-max_len=8192",
            "-rss_limit_mb=2048", "-print_final_stats=1"]  # fmt: skip
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


def run(command: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=4000, help="per property; 0: skip")
    parser.add_argument("--atheris-seconds", type=int, default=180, help="0: skip atheris")
    parser.add_argument("--atheris-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.atheris_worker is not None:
        atheris_worker(args.atheris_worker)
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMOBS_FUZZ_EXAMPLES": str(args.examples)}
    failed = False
    if args.examples > 0:
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        code, out, took = run([*pytest, "tests/unit/observe/test_fuzz.py"], env)
        last = out.strip().splitlines()[-1] if out.strip() else ""
        print(f"hypothesis: {args.examples} examples per property, {took:.0f} s: {last}")
        failed |= code != 0
        if code != 0:
            print(out[-5000:])
    if args.atheris_seconds > 0:
        try:
            import atheris  # noqa: F401, PLC0415
        except ImportError:
            print("atheris: not installed (pip install atheris); skipped")
            return int(failed)
        worker = [sys.executable, __file__, "--atheris-worker", str(args.atheris_seconds)]
        code, out, took = run(worker, env)
        runs = re.search(r"Done (\d+) runs in (\d+) second", out)
        cov = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", out)
        found = "no finding" if code == 0 else f"FINDING (exit {code})"
        stats = f"{int(runs.group(1)):,} inputs" if runs else "?"
        if cov:
            stats += f", coverage {cov[-1][0]} edges, {cov[-1][1]} features, corpus {cov[-1][2]}"
        print(f"atheris: {args.atheris_seconds} s, {stats}: {found}")
        if code != 0:
            print(out[-5000:])
        failed |= code != 0
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
