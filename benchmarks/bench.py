"""``python benchmarks/bench.py [options]``: the same as ``llmobs bench`` (issue 9).

A thin wrapper, so the benchmark runs from a checkout without installing the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmobs.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
