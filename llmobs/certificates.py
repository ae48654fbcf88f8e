"""The sidecar's certificates: read from the files the settings name, kept current while it
runs, counted and logged.

The listener's (``--tls-cert-file``: the proxy port, and the metrics port with
``--metrics-tls``) and the engine leg's (``--upstream-ca-file``, a client certificate) are
each a ``wire.tls.Watched`` context: their files are checked every ``CHECK_EVERY`` seconds,
a rotation applies to the next connection (streams in flight keep theirs), and a rotation to
files that do not load leaves the old certificate in use, logged with the file's flag and
counted (``llmobs_tls_certificate_reloads_total{result="error"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from llmobs.config.settings import Settings, source
from llmobs.export.metrics.transport import CLIENT, SERVING, TransportMetrics
from llmobs.wire.tls import (
    ALPN_H2,
    ALPN_HTTP1,
    ClientFiles,
    EngineTls,
    ServerFiles,
    ServerTls,
    TlsError,
    Watched,
    certificates,
    client_context,
    following,
    keep_current,
    not_after,
    server_tls,
)

log = logging.getLogger("llmobs")
T = TypeVar("T")

CHECK_EVERY = 5.0  # seconds between checks of the certificate files (a stat of each)


class Certificates:
    """The listener's and the engine leg's TLS contexts, as the settings ask (each None when
    not asked); a ``TlsError`` naming the file if one does not load at start."""

    def __init__(
        self, settings: Settings, metrics: TransportMetrics, check_every: float = CHECK_EVERY
    ) -> None:
        self.metrics = metrics
        self._every = check_every
        self._tasks: list[asyncio.Task[None]] = []
        self.serving: Watched[ServerTls] | None = None
        self.metrics_tls = settings.metrics_tls
        if settings.tls_cert_file:
            files = ServerFiles(
                settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
            )
            alpn = (ALPN_H2, ALPN_HTTP1) if settings.http2 else (ALPN_HTTP1,)
            self.serving = Watched(files.paths(), lambda: server_tls(files, alpn))
            metrics.expires(SERVING, self.serving.current.expiry)
        self.client: Watched[tuple[ssl.SSLContext, ssl.SSLContext]] | None = None
        self._client_cert_file = settings.upstream_cert_file
        self._host = urlsplit(settings.upstream).hostname or ""
        self._server_name = settings.upstream_server_name
        if settings.upstream.lower().startswith("https://"):
            self.client = _client(settings, metrics)

    def proxy(self) -> Callable[[], ssl.SSLContext] | None:
        """The proxy port's context now, for each new connection (None: plain HTTP)."""
        serving = self.serving
        return None if serving is None else lambda: serving.current.proxy

    def admin(self) -> ssl.SSLContext | None:
        """The metrics port's context (None: plain HTTP): HTTP/1.1 only, no client
        certificate asked, switched to the newest certificate at each handshake."""
        serving = self.serving
        if serving is None or not self.metrics_tls:
            return None
        return following(lambda: serving.current.admin)

    def engine(self) -> EngineTls | None:
        """How to reach an https engine: the context now, for each new connection, and the
        name to check (None: plain http)."""
        client = self.client
        if client is None:
            return None
        return EngineTls(
            lambda: client.current[0], self._host, self._server_name,
            lambda: client.current[1],
        )  # fmt: skip

    def start(self) -> None:
        """Check the files every ``check_every`` seconds from now on."""
        if self.serving is not None:
            self._watch(SERVING, self.serving, lambda tls: tls.expiry)
        if self.client is not None:
            cert_file = self._client_cert_file
            self._watch(CLIENT, self.client, lambda _: _expiry(cert_file) if cert_file else None)

    def _watch(self, name: str, watched: Watched[T], expiry: Callable[[T], float | None]) -> None:
        metrics = self.metrics

        def told(took: bool, error: TlsError | None) -> None:
            metrics.reloaded(name, took)
            if error is not None:
                log.error("%s certificate not reloaded: %s", name, error.sentence(source))
                return
            log.info("%s certificate reloaded", name)
            when = expiry(watched.current)
            if when is not None:
                metrics.expires(name, when)

        task = asyncio.get_running_loop().create_task(keep_current(watched, self._every, told))
        self._tasks.append(task)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()


def _expiry(cert_file: str) -> float:
    return not_after(certificates("upstream_cert_file", cert_file)[0])


def _client(
    settings: Settings, metrics: TransportMetrics
) -> Watched[tuple[ssl.SSLContext, ssl.SSLContext]]:
    """The engine leg's contexts from its files: HTTP/1.1's, and HTTP/2's (h2 by ALPN)."""
    files = ClientFiles(
        settings.upstream_ca_file,
        settings.upstream_cert_file,
        settings.upstream_key_file,
        settings.upstream_insecure_skip_verify,
    )
    if files.insecure:
        log.warning(
            "%s: the engine's certificate is NOT checked; anyone between the sidecar and %s "
            "can read and change its traffic",
            source("upstream_insecure_skip_verify"),
            settings.upstream,
        )
    watched = Watched(
        files.paths(), lambda: (client_context(files), client_context(files, (ALPN_H2,)))
    )
    if files.cert_file:
        metrics.expires(CLIENT, _expiry(files.cert_file))
    return watched
