"""Whose request it is (``observe.tenants``, ``config.tenants``): the key file's name first,
then the header, then the key's short fingerprint; the key file and its errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from multidict import CIMultiDict

from llmobs.config.options import ConfigError
from llmobs.config.tenants import Tenancy, check_metrics, fingerprint, load_keys, short_name
from llmobs.observe.tenants import api_key, tenant_of

KEY = "sk-abc123"
PRINT = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()


def headers(**given: str) -> CIMultiDict[str]:
    return CIMultiDict({k.replace("_", "-"): v for k, v in given.items()})


def test_the_key_comes_from_the_usual_headers() -> None:
    assert api_key(headers(Authorization=f"Bearer {KEY}")) == KEY
    assert api_key(headers(Authorization=f"bearer   {KEY} ")) == KEY
    assert api_key(headers(x_api_key=KEY)) == KEY  # Anthropic's
    assert api_key(headers(api_key=KEY)) == KEY  # Azure OpenAI's
    assert api_key(headers(Authorization="Basic dXNlcjpwYXNz")) is None
    assert api_key(headers(Authorization="Bearer ", x_api_key=" ")) is None
    assert api_key(headers()) is None


def test_fingerprints() -> None:
    assert fingerprint(KEY) == PRINT
    assert short_name(PRINT) == "key-" + PRINT[7:19] and len(short_name(PRINT)) == 16


def test_the_key_files_name_then_the_header_then_the_fingerprint() -> None:
    every = Tenancy("X-Tenant", {PRINT: "team-a"}, fingerprints=True)
    assert tenant_of(every, headers(Authorization=f"Bearer {KEY}", X_Tenant="b")) == "team-a"
    other = headers(Authorization="Bearer sk-other", X_Tenant=" b ")
    assert tenant_of(every, other) == "b"
    assert tenant_of(every, headers(Authorization="Bearer sk-other")) == short_name(
        fingerprint("sk-other"))  # fmt: skip
    assert tenant_of(every, headers()) is None
    header_only = Tenancy("X-Tenant")
    assert tenant_of(header_only, headers(Authorization=f"Bearer {KEY}")) is None
    assert tenant_of(header_only, headers(x_tenant="c")) == "c"  # any case
    keys_only = Tenancy(keys={PRINT: "team-a"})
    assert tenant_of(keys_only, headers(Authorization="Bearer sk-other")) is None
    assert tenant_of(keys_only, headers(X_Tenant="b")) is None
    assert not Tenancy().on and Tenancy(fingerprints=True).on
    assert every.names == frozenset({"team-a"})


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
    assert check_metrics(("requests", "itl")) == ("requests", "itl")
    with pytest.raises(ConfigError, match="unknown 'tokenz'"):
        check_metrics(("tokenz",))
