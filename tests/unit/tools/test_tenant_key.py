"""``llmobs tenant-key`` (``tools.tenant_key``): a fingerprint per key read, one a line, in the
form the ``--tenant-keys`` file holds; blank lines and surrounding spaces are no keys, and no
key at all is exit 2 and a sentence on standard error. Through the command line:
tests/unit/test_main.py."""

from __future__ import annotations

import hashlib
import io

from llmobs.config.tenants import fingerprint
from llmobs.tools.tenant_key import NO_KEY, run_tenant_key

# SHA-256 of "abc", the test vector of FIPS 180-2
ABC = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def _run(text: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_tenant_key(io.StringIO(text), out, err)
    assert not err.getvalue() if code == 0 else err.getvalue() == NO_KEY + "\n"
    return code, out.getvalue()


def test_each_key_read_is_printed_as_its_fingerprint() -> None:
    code, out = _run("abc\n\n  sk-live-1 \r\nlast-without-newline")
    assert code == 0
    assert out.splitlines() == [ABC, fingerprint("sk-live-1"), fingerprint("last-without-newline")]
    assert fingerprint("sk-live-1") == "sha256:" + hashlib.sha256(b"sk-live-1").hexdigest()
    assert "sk-live" not in out  # the key itself is never written


def test_no_key_is_exit_2_and_a_sentence_saying_how_to_give_one() -> None:
    assert _run("") == (2, "")  # nothing on standard output; the sentence on standard error
    assert _run("\n   \n\t\n") == (2, "")
    assert "no key on standard input" in NO_KEY and "< key.txt" in NO_KEY
