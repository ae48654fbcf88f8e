"""The tenants' rules as configured (``config.tenants``): key fingerprints, the key file and
its errors, and the families labelled by tenant. Whose a request is:
``tests/unit/observe/test_tenants.py``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llmobs.config.options import ConfigError
from llmobs.config.tenants import METRIC_NAMES, check_metrics, fingerprint, load_keys, short_name

KEY = "sk-abc123"
PRINT = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()


def test_fingerprints() -> None:
    assert fingerprint(KEY) == PRINT
    assert short_name(PRINT) == "key-" + PRINT[7:19] and len(short_name(PRINT)) == 16


def test_the_key_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(f"tenants:\n  {PRINT.upper().replace('SHA256', 'sha256')}: ' team-a '\n")
    assert load_keys(str(path)) == {PRINT: "team-a"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tenants: []\n", "a top-level mapping 'tenants:'"),
        ("- a\n", "a top-level mapping 'tenants:'"),
        (f"tenants:\n  {KEY}: team-a\n", "entry 1: expected 'sha256:' and 64 hex digits"),
        ("tenants:\n  sha256:abc: team-a\n", "entry 1: expected 'sha256:'"),
        (f"tenants:\n  {PRINT}: ''\n", "entry 1: a name of 1-128 characters"),
        (f"tenants:\n  {PRINT}: 7\n", "entry 1: a name"),
        ("tenants: [\n", "tenants.yaml"),
    ],
)
def test_a_bad_key_file_is_refused_with_where(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_keys(str(path))


def test_the_families_named() -> None:
    assert check_metrics(("requests", "itl")) is None
    assert check_metrics(METRIC_NAMES) is None
    assert check_metrics(("requests", "tokenz")) == (
        f"unknown 'tokenz'; expected some of {', '.join(METRIC_NAMES)}"
    )
