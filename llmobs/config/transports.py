"""The transports' options that only make sense together: TLS on the listener (a certificate
needs its key; a client CA and the metrics port's TLS need a certificate) and to the engine
(only for an https upstream; no CA file beside "check nothing"). The files themselves are
read, and named when wrong, as the sidecar starts (``llmobs.certificates``)."""

from __future__ import annotations

from collections.abc import Callable

from llmobs.config.options import ConfigError

Value = Callable[[str], object]  # a setting's value by field name
Source = Callable[[str], str]  # how a field is set: its flag and variable

_PAIRS = (("tls_cert_file", "tls_key_file"), ("upstream_cert_file", "upstream_key_file"))
_NEED_CERT = ("tls_client_ca_file", "metrics_tls")
_NEED_HTTPS = (
    "upstream_ca_file", "upstream_server_name", "upstream_cert_file",
    "upstream_insecure_skip_verify",
)  # fmt: skip


def check_tls(value: Value, source: Source) -> None:
    """A ``ConfigError`` naming the options that do not go together, if any do not."""
    for cert, key in _PAIRS:
        if bool(value(cert)) != bool(value(key)):
            raise ConfigError(f"{source(cert)} and {source(key)} go together: give both")
    for name in _NEED_CERT:
        if value(name) and not value("tls_cert_file"):
            raise ConfigError(f"{source(name)}: needs {source('tls_cert_file')} as well")
    upstream = str(value("upstream"))
    for name in _NEED_HTTPS:
        if value(name) and not upstream.lower().startswith("https://"):
            raise ConfigError(f"{source(name)}: the upstream {upstream} is not https://")
    if value("upstream_insecure_skip_verify") and value("upstream_ca_file"):
        raise ConfigError(
            f"{source('upstream_insecure_skip_verify')} and {source('upstream_ca_file')}: "
            "choose one (a CA file checks the engine; the other checks nothing)"
        )
