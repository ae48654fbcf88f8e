"""Mutation testing of the pure core, one module at a time (docs/testing.md).

Not a test: run it by hand (before a release, or after changing one of these modules) and
record the result in docs/testing.md. Needs mutmut 3: ``pip install -e '.[mutation]'``.

For each module named in benchmarks/mutation.toml, mutmut mutates that module alone and runs,
for each mutant, those of the module's unit tests that reach the mutated function. A mutant
that no test notices survives. The known-equivalent mutants listed in mutation.toml (those no
test can kill because they change no behaviour) are left out of the score:

    score = (killed + timed out) / (mutants - equivalent)

and the script exits 1 when a module scores below ``--threshold`` (90 %), or when a listed
equivalent no longer names a surviving mutant that reads its ``change`` (the code moved: the
list is to be fixed, never trusted blindly).

Each module runs in a fresh copy of the checkout under build/mutation/<module>/: mutmut takes
its settings from ``[tool.mutmut]`` of the pyproject.toml where it runs, and the copy gets the
project's, narrowed to the module and its tests. The copy is kept, to look at a survivor:

    cd build/mutation/slo && mutmut show <mutant>     # or: mutmut browse

    python benchmarks/mutation.py                     # every module of mutation.toml
    python benchmarks/mutation.py slo labels          # some (a name, or the module's path)
    python benchmarks/mutation.py --show policy       # and the diff of every survivor
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODULES = Path(__file__).with_name("mutation.toml")
WORK = ROOT / "build" / "mutation"
KILLED = frozenset({"killed", "timeout"})
# `mutmut run` as its console script does it: mutmut.__main__ imported once, not run as __main__
MUTMUT = ["-c", "import sys; from mutmut.__main__ import cli; sys.argv[0] = 'mutmut'; cli()"]


@dataclass(frozen=True)
class Equivalent:
    mutant: str
    change: str
    reason: str


@dataclass(frozen=True)
class Module:
    name: str
    path: str
    tests: tuple[str, ...]
    equivalents: tuple[Equivalent, ...]


@dataclass
class Result:
    module: Module
    seconds: float
    status: dict[str, str]  # mutant name -> mutmut's status ("killed", "survived", ...)
    equivalent: set[str] = field(default_factory=set)
    stale: list[str] = field(default_factory=list)  # equivalents that no longer hold

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.status.values())

    @property
    def survivors(self) -> list[str]:
        """Mutants no test killed, the known equivalents left out."""
        return [
            name
            for name, status in self.status.items()
            if status not in KILLED and name not in self.equivalent
        ]

    @property
    def score(self) -> float:
        counted = len(self.status) - len(self.equivalent)
        killed = sum(self.counts[s] for s in KILLED)
        return 100.0 * killed / counted if counted else 100.0


def load_modules() -> dict[str, Module]:
    data = tomllib.loads(MODULES.read_text())
    return {
        name: Module(
            name,
            entry["path"],
            tuple(entry["tests"]),
            tuple(Equivalent(**e) for e in entry.get("equivalent", [])),
        )
        for name, entry in data.items()
    }


def toml_value(value: Any) -> str:
    """A setting of ``[tool.mutmut]`` as TOML: strings, numbers, booleans and lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)  # a JSON string or number is a TOML one


def pyproject_for(module: Module) -> str:
    """The project's pyproject.toml with its ``[tool.mutmut]`` narrowed to ``module``."""
    text = (ROOT / "pyproject.toml").read_text()
    settings = dict(tomllib.loads(text).get("tool", {}).get("mutmut", {}))
    settings.update(
        only_mutate=[module.path],
        pytest_add_cli_args_test_selection=list(module.tests),
        use_git_change_detection=False,  # the copy is no checkout of its own
    )
    section = re.compile(r"^\[tool\.mutmut\]\n(?:(?!\[).*\n?)*", re.MULTILINE)
    text = section.sub("", text).rstrip("\n")
    lines = [f"{key} = {toml_value(value)}" for key, value in settings.items()]
    return text + "\n\n[tool.mutmut]\n" + "\n".join(lines) + "\n"


def prepare(module: Module) -> Path:
    """A fresh copy of what the tests import: the package, the tests, pyproject.toml."""
    folder = WORK / module.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*_cache", ".hypothesis")
    for name in ("llmobs", "tests"):
        shutil.copytree(ROOT / name, folder / name, ignore=ignore)
    (folder / "pyproject.toml").write_text(pyproject_for(module))
    return folder


def mutmut(folder: Path, *args: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, *MUTMUT, *args]
    if log is None:
        return subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
    with log.open("w") as out:
        return subprocess.run(
            command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, text=True, check=False
        )


def added_lines(folder: Path, mutant: str) -> list[str]:
    """The lines a mutant reads instead of the original's, from ``mutmut show``."""
    diff = mutmut(folder, "show", mutant).stdout
    return [
        line[1:].strip()
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]


def run(module: Module, children: int) -> Result:
    """Mutate ``module``, run its tests against each mutant, check its equivalents; the time
    is all of it, from the copy to the last check."""
    start = time.perf_counter()
    folder = prepare(module)
    log = folder / "mutmut.log"
    done = mutmut(folder, "run", "--max-children", str(children), log=log)
    meta = folder / "mutants" / f"{module.path}.meta"
    if done.returncode != 0 or not meta.exists():
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{module.name}: mutmut run exited {done.returncode}:\n{tail}")
    from mutmut.stats import status_by_exit_code  # noqa: PLC0415  (the optional extra)

    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    result = Result(module, 0.0, {k: status_by_exit_code[v] for k, v in codes.items()})
    survived = [e for e in module.equivalents if result.status.get(e.mutant) == "survived"]
    with ThreadPoolExecutor(4) as pool:  # `mutmut show` takes 0.4 s, mostly its imports
        lines = pool.map(lambda e: added_lines(folder, e.mutant), survived)
        changes = dict(zip(survived, lines, strict=True))
    for entry in module.equivalents:
        status = result.status.get(entry.mutant)
        if status is None:
            result.stale.append(f"{entry.mutant}: no such mutant")
        elif status != "survived":
            result.stale.append(f"{entry.mutant}: {status}, not survived")
        elif entry.change not in changes[entry]:
            result.stale.append(f"{entry.mutant}: no longer reads {entry.change!r}")
        else:
            result.equivalent.add(entry.mutant)
    result.seconds = time.perf_counter() - start
    return result


def table(results: list[Result]) -> str:
    """Survived: no test failed; other: not killed either, mostly "no tests" (a function none
    of the module's tests reaches); equivalent: survived, and listed in mutation.toml."""
    head = "| module | mutants | killed | timeout | survived | other | equivalent | score | time |"
    rows = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c = r.counts
        survived = c["survived"] - len(r.equivalent)
        other = len(r.survivors) - survived
        rows.append(
            f"| `{r.module.path}` | {len(r.status)} | {c['killed']} | {c['timeout']} "
            f"| {survived} | {other} | {len(r.equivalent)} | {r.score:.1f} % | {r.seconds:.0f} s |"
        )
    return "\n".join(rows)


def report(result: Result, show: bool) -> None:
    folder = WORK / result.module.name
    others = {s: n for s, n in result.counts.items() if s not in KILLED | {"survived"}}
    if others:  # "no tests": a function none of the module's tests reaches
        print(f"{result.module.name}: besides survivors, not killed: {others}")
    for line in result.stale:
        print(f"{result.module.name}: stale equivalent, not left out (fix mutation.toml): {line}")
    for mutant in result.survivors:
        print(f"{result.module.name}: {result.status[mutant]}: {mutant}")
        if show:
            diff = mutmut(folder, "show", mutant).stdout
            print("\n".join("    " + line for line in diff.splitlines()[1:]))


def main() -> int:
    modules = load_modules()
    by_path = {m.path: m for m in modules.values()}
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"of {', '.join(modules)} (default: all)")
    parser.add_argument("--threshold", type=float, default=90.0, help="lowest score (%%)")
    parser.add_argument("--max-children", type=int, default=2, help="mutmut's workers")
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    args = parser.parse_args()
    if importlib.util.find_spec("mutmut") is None:
        parser.error("mutmut is not installed here: pip install -e '.[mutation]'")
    unknown = [n for n in args.modules if n not in modules and n not in by_path]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {list(modules)}")
    chosen = [modules.get(n) or by_path[n] for n in args.modules] or list(modules.values())
    results = []
    for module in chosen:
        print(f"{module.name}: mutating {module.path} against {' '.join(module.tests)}")
        result = run(module, args.max_children)
        report(result, args.show)
        results.append(result)
    print()
    print(table(results))
    low = [r.module.name for r in results if r.score < args.threshold]
    if low:
        print(f"\nbelow {args.threshold:g} % of non-equivalent mutants killed: {', '.join(low)}")
    stale = [r.module.name for r in results if r.stale]
    if stale:
        print(f"\nstale equivalents in benchmarks/mutation.toml: {', '.join(stale)}")
    return 1 if low or stale else 0


if __name__ == "__main__":
    sys.exit(main())
