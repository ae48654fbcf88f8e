"""Certificates for TLS tests, made by trustme (a real CA's chain, keys on disk as a server
reads them), and the rotation of a server's files as Kubernetes does it: new files in place."""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme

HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Pem:
    """A certificate chain and key written to ``cert`` and ``key``, issued by ``ca``."""

    ca: trustme.CA
    cert: Path
    key: Path

    def trusting(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
        """A client context that trusts this certificate's CA (and no other)."""
        ctx = ssl.create_default_context()
        ctx.load_verify_locations(cadata=self.ca.cert_pem.bytes().decode())
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx


def ca_file(ca: trustme.CA, path: Path) -> Path:
    """The CA's certificate, written where a server or client reads its trust from."""
    ca.cert_pem.write_to_path(str(path))
    return path


def issue(
    ca: trustme.CA,
    directory: Path,
    name: str = "server",
    *hosts: str,
    not_after: datetime.datetime | None = None,
) -> Pem:
    """A leaf certificate for ``hosts`` (default ``HOSTS``) written as ``name``.pem/.key."""
    leaf = ca.issue_cert(*(hosts or HOSTS), not_after=not_after)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    return Pem(ca, cert, key)


def client_context(pem: Pem, trust: trustme.CA) -> ssl.SSLContext:
    """A client context that shows ``pem`` (mTLS) and trusts ``trust``."""
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=trust.cert_pem.bytes().decode())
    ctx.load_cert_chain(str(pem.cert), str(pem.key))
    return ctx


def replace(pem: Pem, new: Pem) -> None:
    """Rotate: ``new``'s chain and key written over ``pem``'s files (new inodes, as a rename
    into place gives)."""
    for src, dst in ((new.cert, pem.cert), (new.key, pem.key)):
        tmp = dst.with_suffix(dst.suffix + ".tmp")
        tmp.write_bytes(src.read_bytes())
        tmp.replace(dst)
