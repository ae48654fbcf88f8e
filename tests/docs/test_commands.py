"""Every shell block of README.md and docs/ runs as written (tests/docs/blocks.py says how a
block that needs a server, a stand-in engine or a file is run, and how one that cannot run
here says why)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import SHELLS, Block, Walkthrough, every_block


@pytest.fixture(scope="module")
def walkthroughs(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Walkthrough]:
    return {}


RUNNABLE = [b.param() for b in every_block() if b.syntax in SHELLS or "writes" in b.options()]


@pytest.mark.parametrize("block", RUNNABLE)
def test_block_runs_as_written(
    block: Block, walkthroughs: dict[Path, Walkthrough], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if block.doc not in walkthroughs:
        walkthroughs[block.doc] = Walkthrough.create(tmp_path_factory.mktemp("docs"), block.doc)
    done = walkthroughs[block.doc].run(block)
    assert done.returncode == 0, (
        f"{block.name} exited {done.returncode}:\n{block.code}\n--- output ---\n"
        + done.stdout[-4000:]
    )


def test_every_shell_block_is_run_or_says_why_not() -> None:
    """A block either runs, or carries a skip with a reason that names what covers it."""
    for block in every_block():
        if block.syntax not in SHELLS:
            continue
        for mark in block.marks:
            if mark.startswith("pytest.mark.skip"):
                assert "reason=" in mark and len(mark) > 40, (block.name, mark)
