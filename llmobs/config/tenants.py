"""Tenants as the operator names them: from a request header, or from API keys mapped to names.

The key file (``--tenant-keys``) maps fingerprints of API keys to tenant names::

    tenants:
      sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08: team-a
      sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752: customer-b

``llmobs tenant-key`` prints a key's fingerprint (it reads the key from its input, so that it
stays out of shell histories). A key is never kept: the sidecar compares fingerprints (SHA-256
of the key) and shows only the name the operator chose; with ``--tenant-fingerprints`` a key the
file does not name is shown as ``key-`` and the first 12 hex digits of its fingerprint (48 bits
of a hash: not a way back to a key of any real length, and not enough to test guesses of one).

Which request families carry the tenant label is the operator's choice (``--tenant-metrics``):
each adds a factor of up to ``--max-tenants`` + 2 to its series (docs/metrics.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmobs.config.options import ConfigError, read_yaml

PREFIX = "sha256:"
SHORT = 12  # hex digits of a fingerprint shown with --tenant-fingerprints
KEY_HEADERS = ("x-api-key", "api-key")  # Anthropic's and Azure OpenAI's, after Authorization
# the request families --tenant-metrics can name (the catalogue's TENANT_METRICS maps them)
METRIC_NAMES = ("requests", "ttft", "phases", "tpot", "duration", "itl", "stalls", "smoothness",
                "tokens", "slo", "cost")  # fmt: skip
DEFAULT_METRICS = ("requests", "ttft", "slo", "tokens", "cost")


def fingerprint(key: str) -> str:
    """A key's fingerprint as the key file holds it: ``sha256:`` and 64 hex digits."""
    return PREFIX + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def short_name(print_: str) -> str:
    """The label of a key the file does not name (``--tenant-fingerprints``)."""
    return "key-" + print_[len(PREFIX) : len(PREFIX) + SHORT]


@dataclass(frozen=True)
class Tenancy:
    """How a request's tenant is found: a header's value, a key's name in ``keys``
    (fingerprint -> name), a key's short fingerprint; and which families are labelled by it."""

    header: str = ""
    keys: Mapping[str, str] = field(default_factory=dict)
    fingerprints: bool = False
    metrics: tuple[str, ...] = ()

    @property
    def on(self) -> bool:
        return bool(self.header or self.keys or self.fingerprints)

    @property
    def names(self) -> frozenset[str]:
        """The tenants the key file names: the operator's own, always labelled as named."""
        return frozenset(self.keys.values())


def load_keys(path: str) -> dict[str, str]:
    """The key file's fingerprints and names; ``ConfigError`` naming the file and the entry
    for anything else (a key itself in place of a fingerprint above all)."""
    loaded = read_yaml(path, "--tenant-keys")
    entries = loaded.get("tenants") if isinstance(loaded, dict) else None
    if not isinstance(entries, dict):
        raise ConfigError(f"--tenant-keys {path}: expected a top-level mapping 'tenants:'")
    out: dict[str, str] = {}
    for i, (print_, name) in enumerate(entries.items()):
        if not _is_fingerprint(print_):
            raise ConfigError(
                f"--tenant-keys {path}: entry {i + 1}: expected 'sha256:' and 64 hex digits "
                "(`llmobs tenant-key` prints a key's), not a key"
            )
        if not isinstance(name, str) or not name.strip() or len(name) > 128:
            raise ConfigError(f"--tenant-keys {path}: entry {i + 1}: a name of 1-128 characters")
        out[print_.lower()] = name.strip()
    return out


def _is_fingerprint(value: object) -> bool:
    if not isinstance(value, str) or not value.lower().startswith(PREFIX):
        return False
    digits = value[len(PREFIX) :]
    return len(digits) == 64 and all(c in "0123456789abcdefABCDEF" for c in digits)


def check_metrics(names: tuple[str, ...]) -> str | None:
    """What is wrong with ``--tenant-metrics``' names (its check: ``llmobs.config.checks``)."""
    unknown = [n for n in names if n not in METRIC_NAMES]
    if unknown:
        return f"unknown {unknown[0]!r}; expected some of {', '.join(METRIC_NAMES)}"
    return None
