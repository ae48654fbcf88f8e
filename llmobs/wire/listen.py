"""A server that cannot listen where its settings say, told in one sentence.

``listening(host, port)`` wraps the bind of a server: the ``OSError`` of a taken port, an
address that is not this machine's or a port below 1024 without the privilege becomes a
``ListenError`` naming the settings fields, so that each command names its own flags (``serve``
its ``LLMOBS_*`` variables, ``sim`` its ``LLMOBS_SIM_*`` ones, ``demo`` only flags).
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable, Iterator


class ListenError(Exception):
    """A server could not listen on ``host``:``port``, set by ``host_field`` and
    ``port_field`` of its settings."""

    def __init__(
        self, host: str, port: int, reason: OSError, host_field: str, port_field: str
    ) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.host, self.port, self.reason = host, port, reason
        self.host_field, self.port_field = host_field, port_field

    def sentence(self, source: Callable[[str], str]) -> str:
        """What went wrong and what to do; ``source`` names how a field is set (its flag)."""
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        port = source(self.port_field)
        both = f"{source(self.host_field)}, {port}"
        code = self.reason.errno
        if code == errno.EADDRINUSE:
            return (
                f"{address} is already in use ({port}): stop the process listening there, or "
                "choose another port"
            )
        if code == errno.EACCES:
            return f"no permission to listen on {address} ({port}): choose a port above 1023"
        if code == errno.EADDRNOTAVAIL or isinstance(self.reason, socket.gaierror):
            return (
                f"cannot listen on {address} ({both}): {self.host} is not an address of this "
                "machine; choose one that is, or 0.0.0.0 for all of them"
            )
        why = self.reason.strerror or str(self.reason)
        return f"cannot listen on {address} ({both}): {why}; choose another address or port"


@contextlib.contextmanager
def listening(
    host: str, port: int, host_field: str = "host", port_field: str = "port"
) -> Iterator[None]:
    """Around a server's bind: its ``OSError`` becomes a ``ListenError``."""
    try:
        yield
    except OSError as exc:
        raise ListenError(host, port, exc, host_field, port_field) from exc
