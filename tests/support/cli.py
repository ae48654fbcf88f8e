"""``llmobs`` commands run in the test's process, as a user types them: exit code and output."""

from __future__ import annotations

import contextlib
import io

from llmobs.__main__ import main


def cli(*argv: str) -> tuple[int, str]:
    """``llmobs *argv``: its exit code and what it printed on stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()
