"""Whose request it is (``observe.tenants``, ``config.tenants``): the key file's name first,
then the header, then the key's short fingerprint (the key file and its errors:
``tests/unit/config/test_tenants.py``)."""

from __future__ import annotations

import hashlib

from multidict import CIMultiDict

from llmobs.config.tenants import Tenancy, fingerprint, short_name
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
