"""TLS contexts made from files, for the listener and for the engine, and remade when the files
change.

Why remade from files rather than watched by inotify: Kubernetes mounts a Secret as symbolic
links that it swaps atomically (``..data``), which inotify on the file itself misses; a ``stat``
of each path (following links) every few seconds sees every rotation, costs three system calls,
and needs no library. A context is only replaced once the new files load whole: a certificate
replaced by garbage, or a key that no longer matches it, leaves the old context in use and
yields an error (``Watched.check``), so a botched rotation never drops a listener.

The listener's context is taken per connection (``accept.TlsAccept``), so connections made after
a rotation get the new certificate and those in flight keep theirs.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from cryptography import x509

T = TypeVar("T")

ALPN_H2 = "h2"
ALPN_HTTP1 = "http/1.1"


class TlsError(Exception):
    """A TLS file that cannot be used: ``field`` names the setting that points at it."""

    def __init__(self, field: str, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.field, self.path, self.problem = field, path, problem

    def sentence(self, source: Callable[[str], str]) -> str:
        """What is wrong with which file and what to do; ``source`` names how ``field`` is set."""
        return f"{source(self.field)}: {self.path} {self.problem}"


@dataclass(frozen=True, slots=True)
class ServerFiles:
    """The listener's certificate chain and key (PEM), and the CAs whose client certificates
    it accepts (mTLS; empty: no client certificate asked for)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""

    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


@dataclass(frozen=True, slots=True)
class ClientFiles:
    """How the engine's certificate is checked and what the sidecar shows it: a CA file (empty:
    the system's trust store), a client certificate and key (mTLS), or no check at all
    (``insecure``: a pod's self-signed certificate; logged loudly at start)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure: bool = False

    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.ca_file, self.cert_file, self.key_file) if p)


def _read(field: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TlsError(field, path, "does not exist; check the path") from None
    except IsADirectoryError:
        raise TlsError(field, path, "is a directory, not a PEM file") from None
    except PermissionError:
        raise TlsError(field, path, "is not readable by this process; check its mode") from None
    except OSError as exc:
        raise TlsError(field, path, f"cannot be read ({exc.strerror})") from None


def certificates(field: str, path: str) -> list[x509.Certificate]:
    """The PEM certificates in ``path``: at least one, else a ``TlsError`` naming the file."""
    data = _read(field, path)
    try:
        found = x509.load_pem_x509_certificates(data)
    except ValueError:
        found = []
    if not found:
        raise TlsError(field, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return found


def not_after(cert: x509.Certificate) -> float:
    """When ``cert`` expires, in seconds since the epoch."""
    return cert.not_valid_after_utc.timestamp()


def _load_chain(ctx: ssl.SSLContext, cert_field: str, key_field: str, cert: str, key: str) -> None:
    """``ctx.load_cert_chain``, its OpenSSL errors told as which file is wrong."""
    certificates(cert_field, cert)
    if not _read(key_field, key).strip():
        raise TlsError(key_field, key, "is empty; it should hold the PEM private key")
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = "does not match the certificate" if "MISMATCH" in str(exc) else "is not a PEM key"
        raise TlsError(key_field, key, f"{why} in {cert}; give the key issued with it") from None


def _load_cas(ctx: ssl.SSLContext, field: str, path: str) -> None:
    certificates(field, path)
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError:
        raise TlsError(field, path, "holds a certificate OpenSSL cannot load as a CA") from None


def server_context(files: ServerFiles, alpn: Sequence[str]) -> ssl.SSLContext:
    """The listener's context: TLS 1.2 or later with Python's default ciphers, the chain and
    key, a client certificate required when a client CA is given, ``alpn`` offered in order."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    _load_chain(ctx, "tls_cert_file", "tls_key_file", files.cert_file, files.key_file)
    if files.client_ca_file:
        _load_cas(ctx, "tls_client_ca_file", files.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def client_context(files: ClientFiles, alpn: Sequence[str] = (ALPN_HTTP1,)) -> ssl.SSLContext:
    """The engine leg's context: the system's trust store or ``ca_file``, the host name checked
    (against the server name given), a client certificate when given; or no check."""
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if files.ca_file:
        _load_cas(ctx, "upstream_ca_file", files.ca_file)
    if files.cert_file or files.key_file:
        _load_chain(
            ctx,
            "upstream_cert_file",
            "upstream_key_file",
            files.cert_file,
            files.key_file or files.cert_file,
        )
    if files.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def _signature(paths: Sequence[str]) -> tuple[tuple[int, int, int], ...]:
    """What changes when a file is replaced: its inode, size and modification time (a missing
    file reads as zeros, so that its return is a change too)."""
    sig = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            sig.append((0, 0, 0))
        else:
            sig.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(sig)


class Watched(Generic[T]):
    """A value made from files (``build``), remade when one of them changes.

    ``current`` is the last value that built; ``check()`` stats the files and, when they
    changed, builds again: True when it replaced the value, False when the new files did not
    build (the old value stays; the ``TlsError`` is in ``error``), None when nothing changed.
    """

    def __init__(self, paths: Sequence[str], build: Callable[[], T]) -> None:
        self._paths = tuple(paths)
        self._build = build
        self._seen = _signature(self._paths)
        self.current: T = build()  # a TlsError here is the start-up's: the caller's to report
        self.error: TlsError | None = None

    def check(self) -> bool | None:
        seen = _signature(self._paths)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            value = self._build()
        except TlsError as exc:
            self.error = exc
            return False
        self.current, self.error = value, None
        return True


@dataclass(frozen=True, slots=True)
class EngineTls:
    """How the sidecar reaches an https engine: the context to use now (its files may rotate),
    and the name to send and check instead of ``host`` (empty: the URL's host)."""

    context: Callable[[], ssl.SSLContext]
    host: str = ""
    server_name: str = ""
    # the context offering h2 alone by ALPN (``--upstream-http2``): HTTP/1.1's connections
    # (a WebSocket's, the collectors') keep theirs, which offers http/1.1 alone
    h2: Callable[[], ssl.SSLContext] | None = None

    def request_args(self, url: str) -> dict[str, Any]:
        """aiohttp's TLS arguments for a request to ``url`` (none for plain http): the
        context, and the server name where ``url`` is the engine's host."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "https":
            return {}
        args: dict[str, Any] = {"ssl": self.context()}
        if self.server_name and parts.hostname == self.host:
            args["server_hostname"] = self.server_name
        return args


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The listener's contexts, kept current: the proxy's (``alpn``: h2 and HTTP/1.1) and the
    admin port's (HTTP/1.1 only, its server speaking no HTTP/2), with the certificate's expiry."""

    proxy: ssl.SSLContext
    admin: ssl.SSLContext
    expiry: float


def server_tls(files: ServerFiles, alpn: Sequence[str]) -> ServerTls:
    """Both contexts from ``files`` (a ``TlsError`` names the file that is wrong)."""
    leaf = certificates("tls_cert_file", files.cert_file)[0]
    return ServerTls(
        server_context(files, alpn), server_context(files, (ALPN_HTTP1,)), not_after(leaf)
    )


def following(current: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """A context for a server that takes one at start (aiohttp's site): each handshake
    switches to ``current()`` as the ClientHello arrives, so a rotation applies from the next
    connection on there too."""
    base = current()

    def switch(obj: ssl.SSLObject | ssl.SSLSocket, name: str | None, ctx: ssl.SSLContext) -> None:
        obj.context = current()

    base.sni_callback = switch
    return base


async def keep_current(
    watched: Watched[T], every: float, told: Callable[[bool, TlsError | None], None]
) -> None:
    """Check ``watched``'s files every ``every`` seconds until cancelled; ``told`` each
    change: whether it took, and the error when it did not."""
    while True:
        await asyncio.sleep(every)
        changed = watched.check()
        if changed is not None:
            told(changed, watched.error)
