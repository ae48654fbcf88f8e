"""``llmobs tenant-key``: the fingerprint of an API key, for the ``--tenant-keys`` file.

Reads keys from its input, one a line (``llmobs tenant-key < key.txt``, or typed and ended
with Ctrl-D), so that no key is left in a shell's history or a process list, and prints one
``sha256:...`` line each. Nothing else is kept or sent anywhere.
"""

from __future__ import annotations

from typing import TextIO

from llmobs.config.tenants import fingerprint


def run_tenant_key(source: TextIO, out: TextIO) -> int:
    """Print each key's fingerprint; 2 when no key was given."""
    count = 0
    for line in source:
        key = line.strip()
        if key:
            print(fingerprint(key), file=out)
            count += 1
    return 0 if count else 2
