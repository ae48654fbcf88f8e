"""The transports' options that go together (``config.transports``), told by their flags."""

from __future__ import annotations

from typing import Any

import pytest

from llmobs.config.settings import ConfigError, Settings

HTTPS = "https://engine.local:8443"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"tls_cert_file": "c.pem"}, "--tls-cert-file / LLMOBS_TLS_CERT_FILE and --tls-key-file"),
        ({"tls_key_file": "k.pem"}, "and --tls-key-file / LLMOBS_TLS_KEY_FILE go together"),
        (
            {"tls_client_ca_file": "ca.pem"},
            "--tls-client-ca-file / LLMOBS_TLS_CLIENT_CA_FILE: needs",
        ),
        ({"metrics_tls": True}, "--metrics-tls / LLMOBS_METRICS_TLS: needs --tls-cert-file"),
        ({"upstream_ca_file": "ca.pem"}, "the upstream http://127.0.0.1:8000 is not https://"),
        ({"upstream_server_name": "x"}, "--upstream-server-name / LLMOBS_UPSTREAM_SERVER_NAME:"),
        ({"upstream_insecure_skip_verify": True}, "is not https://"),
        (
            {"upstream": HTTPS, "upstream_cert_file": "c.pem"},
            "--upstream-cert-file / LLMOBS_UPSTREAM_CERT_FILE and --upstream-key-file",
        ),
        (
            {"upstream": HTTPS, "upstream_insecure_skip_verify": True, "upstream_ca_file": "c"},
            "choose one",
        ),
    ],
)
def test_options_that_do_not_go_together_are_named(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(**given)
    assert says in str(caught.value)


def test_options_that_go_together_are_taken() -> None:
    s = Settings(
        tls_cert_file="c.pem", tls_key_file="k.pem", tls_client_ca_file="ca.pem",
        metrics_tls=True, upstream=HTTPS, upstream_ca_file="engine.pem",
        upstream_server_name="engine", upstream_cert_file="me.pem", upstream_key_file="me.key",
    )  # fmt: skip
    assert s.metrics_tls and s.upstream_server_name == "engine"
    env = {"LLMOBS_UPSTREAM": HTTPS, "LLMOBS_UPSTREAM_INSECURE_SKIP_VERIFY": "true"}
    assert Settings.from_sources(env).upstream_insecure_skip_verify
