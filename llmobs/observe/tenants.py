"""Whose request it is: the tenant the operator's rules name (``config.tenants``), pure.

In order: the name the key file gives the request's API key (the operator's own mapping, so
it comes first: a header is whatever the client sends); the tenant header's value; with
``--tenant-fingerprints``, ``key-`` and 12 hex digits of the key's SHA-256; else none (the
label ``unknown``). The key itself goes no further than ``fingerprint``.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmobs.config.tenants import KEY_HEADERS, Tenancy, fingerprint, short_name


def api_key(headers: Mapping[str, str]) -> str | None:
    """The request's API key: ``Authorization: Bearer <key>``, else ``x-api-key`` or
    ``api-key``; None when it sends none."""
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            return key.strip()
    for name in KEY_HEADERS:
        found = headers.get(name)
        if found is not None and found.strip():
            return found.strip()
    return None


def tenant_of(tenancy: Tenancy, headers: Mapping[str, str]) -> str | None:
    """The request's tenant by ``tenancy``'s rules; None: none named."""
    key = api_key(headers) if tenancy.keys or tenancy.fingerprints else None
    print_ = fingerprint(key) if key is not None else None
    if print_ is not None:
        name = tenancy.keys.get(print_)
        if name is not None:
            return name
    if tenancy.header:
        value = headers.get(tenancy.header)
        if value is not None and value.strip():
            return value.strip()
    if print_ is not None and tenancy.fingerprints:
        return short_name(print_)
    return None
