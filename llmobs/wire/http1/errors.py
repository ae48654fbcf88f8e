"""The two ways an HTTP/1.1 exchange fails on a peer's bytes."""

from __future__ import annotations


class ProtocolError(ConnectionError):
    """The peer sent something that is not HTTP/1.x (the connection is then dropped)."""


class BadRequest(ProtocolError):
    """A client's request the server answers with ``status`` (400, 405, 431, 501, 505) and
    closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
