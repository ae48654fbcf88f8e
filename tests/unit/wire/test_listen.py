"""A server that cannot listen, told in one sentence (``wire/listen.py``): the bind's
``OSError`` becomes a ``ListenError`` naming the address and the settings that chose it, and
its sentence says what to do for each cause (a port in use, a privileged one, an address not
this machine's, anything else), each command naming its own flags."""

from __future__ import annotations

import errno
import socket

import pytest

from llmobs.wire.listen import ListenError, listening
from tests.support.ports import port_of, refused_port


def flag(field: str) -> str:
    """How ``serve`` would name a settings field: its flag."""
    return "--" + field.replace("_", "-")


@pytest.mark.parametrize(
    ("host", "reason", "sentence"),
    [
        ("127.0.0.1", OSError(errno.EADDRINUSE, "Address already in use"),
         "127.0.0.1:80 is already in use (--metrics-port): stop the process listening "
         "there, or choose another port"),
        ("0.0.0.0", PermissionError(errno.EACCES, "Permission denied"),
         "no permission to listen on 0.0.0.0:80 (--metrics-port): choose a port above 1023"),
        ("10.9.9.9", OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
         "cannot listen on 10.9.9.9:80 (--metrics-host, --metrics-port): 10.9.9.9 is not an "
         "address of this machine; choose one that is, or 0.0.0.0 for all of them"),
        ("no.such.host", socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
         "cannot listen on no.such.host:80 (--metrics-host, --metrics-port): no.such.host is "
         "not an address of this machine; choose one that is, or 0.0.0.0 for all of them"),
        ("::1", OSError(errno.EMFILE, "Too many open files"),
         "cannot listen on [::1]:80 (--metrics-host, --metrics-port): Too many open files; "
         "choose another address or port"),
    ],
    ids=["in-use", "privileged", "not-ours", "unresolved", "other"],
)  # fmt: skip
def test_each_cause_gets_its_sentence(host: str, reason: OSError, sentence: str) -> None:
    error = ListenError(host, 80, reason, "metrics_host", "metrics_port")
    assert error.sentence(flag) == sentence
    assert str(error) == f"cannot listen on {host}:80: {reason}"


def test_a_bind_that_fails_raises_a_listen_error_naming_its_fields() -> None:
    with refused_port() as taken, socket.socket() as second:
        port = port_of(taken)
        with pytest.raises(ListenError) as caught, listening("127.0.0.1", port, "sim_host"):
            second.bind(("127.0.0.1", port))
    error = caught.value
    assert (error.host, error.port, error.host_field, error.port_field) == (
        "127.0.0.1", port, "sim_host", "port",
    )  # fmt: skip
    assert error.reason.errno == errno.EADDRINUSE
    assert isinstance(error.__cause__, OSError)


def test_what_is_not_an_os_error_passes_unchanged() -> None:
    with pytest.raises(ValueError, match="not a bind"), listening("127.0.0.1", 80):
        raise ValueError("not a bind")
