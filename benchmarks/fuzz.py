"""Fuzzing campaign for the parsers: a large run of what CI runs small.

Not a test: run it by hand and record the result in docs/benchmarks.md.

The properties are ``tests/support/fuzz.py``'s (no exception escapes any decoder, dialect,
request parser or usage stripper; any chunking gives the same result; buffers bounded); this
campaign only drives them longer:

1. **hypothesis**: ``tests/unit/observe/test_fuzz.py`` with ``--examples`` examples per
   property instead of CI's few dozen.
2. **atheris** (coverage-guided libFuzzer; ``pip install atheris``, skipped when absent): for
   ``--atheris-seconds`` seconds, the fuzzer's bytes become a stream, a chunking and a line
   limit, held to every property at once (``check_stream``: the SSE and NDJSON decoders, every
   dialect fed what they decode, the request parser, ``inject_usage`` and the
   ``UsageStripper``).

    python benchmarks/fuzz.py --examples 4000 --atheris-seconds 240
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the properties (and the parsers), loaded before atheris instruments what is loaded
from tests.support.fuzz import check_stream  # noqa: E402

LIMITS = (8, 64, 4096)


def atheris_worker(seconds: int) -> None:
    """Run inside its own process: libFuzzer owns it and exits when the time is up."""
    import atheris  # noqa: PLC0415 - optional: pip install atheris

    atheris.instrument_all()  # coverage of everything loaded: the parsers and what they call

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        limit = fdp.PickValueInList(list(LIMITS))
        cuts = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 12))]
        check_stream(fdp.ConsumeBytes(fdp.remaining_bytes()), cuts, limit)

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
