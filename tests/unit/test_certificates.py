"""The sidecar's certificates (``certificates``): which contexts the settings ask for, the files
read at start (a bad one named by its flag), the client certificate's expiry, the warning when
the engine's certificate is not checked, and a rotation counted and logged."""

from __future__ import annotations

import dataclasses
import logging
import ssl
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from llmobs.certificates import Certificates
from llmobs.config.settings import Settings, source
from llmobs.export.metrics.transport import CLIENT, SERVING, TransportMetrics
from llmobs.export.telemetry import build_telemetry
from llmobs.wire.accept import RESULTS
from llmobs.wire.tls import TlsError
from tests.support.certs import ca_file, issue, replace
from tests.support.servers import eventually

HTTPS = "https://engine.local:8443"


def _metrics() -> TransportMetrics:
    return TransportMetrics(build_telemetry().meter, RESULTS)


def _expiry(path: Path) -> float:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp()


def test_plain_http_asks_for_no_context() -> None:
    certs = Certificates(Settings(), _metrics())
    assert certs.proxy() is None and certs.admin() is None and certs.engine() is None


def test_the_listener_and_the_metrics_port(tmp_path: Path) -> None:
    pem = issue(trustme.CA(), tmp_path)
    metrics = _metrics()
    given = Settings(tls_cert_file=str(pem.cert), tls_key_file=str(pem.key))
    certs = Certificates(given, metrics)
    proxy = certs.proxy()
    assert proxy is not None and isinstance(proxy(), ssl.SSLContext)
    assert certs.admin() is None  # the metrics port stays plain unless asked
    both = dataclasses.replace(given, metrics_tls=True)
    assert isinstance(Certificates(both, metrics).admin(), ssl.SSLContext)
    assert metrics.expiry == {SERVING: _expiry(pem.cert)}


def test_a_bad_file_stops_the_start_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(TlsError) as caught:
        Certificates(Settings(tls_cert_file=missing, tls_key_file=missing), _metrics())
    assert caught.value.sentence(source) == (
        f"--tls-cert-file / LLMOBS_TLS_CERT_FILE: {missing} does not exist; check the path"
    )


def test_the_engine_leg_with_a_client_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    me = issue(ca, tmp_path, "me", "me")
    metrics = _metrics()
    settings = Settings(
        upstream=HTTPS, upstream_ca_file=str(ca_file(ca, tmp_path / "ca.pem")),
        upstream_cert_file=str(me.cert), upstream_key_file=str(me.key),
    )  # fmt: skip
    engine = Certificates(settings, metrics).engine()
    assert engine is not None and engine.context().verify_mode is ssl.CERT_REQUIRED
    assert engine.request_args("http://engine.local:8443/metrics") == {}
    args = engine.request_args("https://engine.local:8443/metrics")
    assert args == {"ssl": engine.context()}  # no server name given: the URL's host

    assert metrics.expiry == {CLIENT: _expiry(me.cert)}


def test_not_checking_the_engine_is_said_loudly(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(upstream=HTTPS, upstream_insecure_skip_verify=True)
    with caplog.at_level(logging.WARNING, logger="llmobs"):
        engine = Certificates(settings, _metrics()).engine()
    assert engine is not None and engine.context().verify_mode is ssl.CERT_NONE
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith(
        "--upstream-insecure-skip-verify / LLMOBS_UPSTREAM_INSECURE_SKIP_VERIFY: the engine's "
        "certificate is NOT checked"
    )


async def test_a_rotation_is_counted_logged_and_its_expiry_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = trustme.CA()
    pem = issue(ca, tmp_path)
    metrics = _metrics()
    settings = Settings(tls_cert_file=str(pem.cert), tls_key_file=str(pem.key))
    certs = Certificates(settings, metrics, check_every=0.01)
    certs.start()
    try:
        with caplog.at_level(logging.INFO, logger="llmobs"):
            new = issue(trustme.CA(), tmp_path, "next")
            replace(pem, new)
            await eventually(lambda: metrics.reloads[SERVING, "ok"] == 1)
        assert metrics.expiry[SERVING] == _expiry(new.cert)
        assert "serving certificate reloaded" in [r.getMessage() for r in caplog.records]
    finally:
        await certs.stop()
