"""TLS contexts from files: which file is wrong and why, the expiry, and a rotation that only
replaces the context once the new files load whole."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
import trustme

from llmobs.wire.tls import (
    ALPN_H2,
    ALPN_HTTP1,
    ClientFiles,
    ServerFiles,
    TlsError,
    Watched,
    client_context,
    server_context,
    server_tls,
)
from tests.support.certs import ca_file, issue, replace


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def test_a_good_chain_and_key_make_a_server_context(ca: trustme.CA, tmp_path: Path) -> None:
    pem = issue(ca, tmp_path)
    ctx = server_context(ServerFiles(str(pem.cert), str(pem.key)), (ALPN_H2, ALPN_HTTP1))
    assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode is ssl.CERT_NONE  # no client certificate asked for


def test_a_client_ca_makes_a_client_certificate_required(ca: trustme.CA, tmp_path: Path) -> None:
    pem = issue(ca, tmp_path)
    clients = ca_file(trustme.CA(), tmp_path / "clients.pem")
    ctx = server_context(ServerFiles(str(pem.cert), str(pem.key), str(clients)), (ALPN_HTTP1,))
    assert ctx.verify_mode is ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("spoil", "field", "says"),
    [
        ("missing_cert", "tls_cert_file", "does not exist"),
        ("garbage_cert", "tls_cert_file", "holds no PEM certificate"),
        ("empty_key", "tls_key_file", "is empty"),
        ("other_key", "tls_key_file", "does not match the certificate"),
        ("garbage_key", "tls_key_file", "is not a PEM key"),
        ("garbage_ca", "tls_client_ca_file", "holds no PEM certificate"),
        ("directory_ca", "tls_client_ca_file", "is a directory"),
    ],
)
def test_a_bad_file_is_named_with_its_flag(
    ca: trustme.CA, tmp_path: Path, spoil: str, field: str, says: str
) -> None:
    pem = issue(ca, tmp_path)
    other = issue(ca, tmp_path, "other")
    cert, key, client_ca = str(pem.cert), str(pem.key), ""
    if spoil == "missing_cert":
        cert = str(tmp_path / "nowhere.pem")
    elif spoil == "garbage_cert":
        pem.cert.write_text("not a certificate\n")
    elif spoil == "empty_key":
        pem.key.write_text("")
    elif spoil == "other_key":
        key = str(other.key)
    elif spoil == "garbage_key":
        pem.key.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    elif spoil == "garbage_ca":
        client_ca = str(tmp_path / "ca.pem")
        Path(client_ca).write_text("garbage")
    else:
        client_ca = str(tmp_path)
    with pytest.raises(TlsError) as caught:
        server_context(ServerFiles(cert, key, client_ca), (ALPN_HTTP1,))
    assert caught.value.field == field
    sentence = caught.value.sentence(_flag)
    assert sentence.startswith(_flag(field) + ": ")
    assert says in sentence


def test_the_expiry_is_the_leafs(ca: trustme.CA, tmp_path: Path) -> None:
    ends = datetime.datetime(2031, 5, 17, 12, 0, tzinfo=datetime.UTC)
    pem = issue(ca, tmp_path, "server", not_after=ends)
    tls = server_tls(ServerFiles(str(pem.cert), str(pem.key)), (ALPN_H2, ALPN_HTTP1))
    assert tls.expiry == ends.timestamp()
    assert tls.proxy is not tls.admin


def test_a_client_context_checks_the_engine_unless_told_not_to(
    ca: trustme.CA, tmp_path: Path
) -> None:
    trust = ca_file(ca, tmp_path / "ca.pem")
    checked = client_context(ClientFiles(ca_file=str(trust)))
    assert checked.verify_mode is ssl.CERT_REQUIRED and checked.check_hostname
    loose = client_context(ClientFiles(insecure=True))
    assert loose.verify_mode is ssl.CERT_NONE and not loose.check_hostname
    with pytest.raises(TlsError) as caught:
        client_context(ClientFiles(cert_file=str(tmp_path / "none.pem")))
    assert caught.value.field == "upstream_cert_file"


def test_a_rotation_replaces_the_value_once_it_builds(ca: trustme.CA, tmp_path: Path) -> None:
    pem = issue(ca, tmp_path)
    files = ServerFiles(str(pem.cert), str(pem.key))
    watched = Watched(files.paths(), lambda: server_tls(files, (ALPN_HTTP1,)))
    first = watched.current
    assert watched.check() is None  # nothing changed
    later = datetime.datetime(2040, 1, 1, tzinfo=datetime.UTC)
    replace(pem, issue(ca, tmp_path, "next", not_after=later))
    assert watched.check() is True
    assert watched.current is not first and watched.current.expiry == later.timestamp()
    assert watched.check() is None

    kept = watched.current
    pem.cert.write_text("garbage, as a botched rotation leaves it\n")
    assert watched.check() is False
    assert watched.current is kept  # the old certificate stays in use
    assert watched.error is not None and watched.error.field == "tls_cert_file"
    replace(pem, issue(ca, tmp_path, "fixed"))
    assert watched.check() is True
    assert watched.error is None and watched.current is not kept


def test_a_file_that_vanishes_and_returns_is_a_change(ca: trustme.CA, tmp_path: Path) -> None:
    pem = issue(ca, tmp_path)
    files = ServerFiles(str(pem.cert), str(pem.key))
    watched = Watched(files.paths(), lambda: server_tls(files, (ALPN_HTTP1,)))
    saved = pem.key.read_bytes()
    pem.key.unlink()
    assert watched.check() is False
    pem.key.write_bytes(saved)
    assert watched.check() is True
