"""``llmobs tenant-key``: the fingerprint of an API key, for the ``--tenant-keys`` file.

Reads keys from its input, one a line (``llmobs tenant-key < key.txt``, or typed and ended
with Ctrl-D), so that no key is left in a shell's history or a process list, and prints one
``sha256:...`` line each. Nothing else is kept or sent anywhere.
"""

from __future__ import annotations

from typing import TextIO

from llmobs.config.tenants import fingerprint

NO_KEY = (
    "llmobs tenant-key: no key on standard input; give one a line, from a file "
    "(llmobs tenant-key < key.txt) or typed and ended with Ctrl-D"
)


def run_tenant_key(source: TextIO, out: TextIO, err: TextIO) -> int:
    """Print each key's fingerprint; 2, and a sentence on ``err``, when no key was given."""
    count = 0
    for line in source:
        key = line.strip()
        if key:
            print(fingerprint(key), file=out)
            count += 1
    if not count:
        print(NO_KEY, file=err)
    return 0 if count else 2
