"""``python -m llmobs.bench``: the same as ``llmobs bench``."""

import sys

from llmobs.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
