"""An HTTP/2 client at the frame level, for what no polite client does: ``h2``'s client state
machine over an asyncio connection, plus raw frames (``hyperframe``) for the attacks its state
machine would refuse to send."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Iterable

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

Headers = list[tuple[str, str]]


class RawH2:
    """One HTTP/2 connection: ``request`` opens streams, ``until`` reads events."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.events: list[h2.events.Event] = []
        self.closed = False
        self.ack = True  # credit what it reads back (WINDOW_UPDATE), as a client should

    @classmethod
    async def connect(
        cls,
        port: int,
        settings: dict[int, int] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> RawH2:
        """Connect to 127.0.0.1:``port`` (over TLS with ``tls``, offering h2) and send the
        preface, with ``settings`` (``h2.settings.SettingCodes`` to values)."""
        if tls is not None:
            tls.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=tls, server_hostname="localhost" if tls else None
        )
        client = cls(reader, writer)
        client.conn.initiate_connection()
        if settings:
            client.conn.update_settings(settings)
        await client.flush()
        return client

    async def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    def raw(self, data: bytes) -> None:
        """Bytes the state machine does not know of (crafted frames)."""
        self.writer.write(data)

    def request(
        self,
        path: str,
        body: bytes | None = None,
        method: str = "POST",
        headers: Iterable[tuple[str, str]] = (),
        end: bool = True,
    ) -> int:
        """Open a stream (its head, and ``body`` if any); ``end``: end the client's half."""
        sid = self.conn.get_next_available_stream_id()
        head = [
            (":method", method), (":scheme", "http"), (":authority", "localhost"),
            (":path", path), *headers,
        ]  # fmt: skip
        if body is not None:
            head.append(("content-type", "application/json"))
        self.conn.send_headers(sid, head, end_stream=end and body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        return sid

    async def until(
        self, done: Callable[[list[h2.events.Event]], bool], within: float = 30.0
    ) -> list[h2.events.Event]:
        """Read until ``done(events so far)`` or the connection closes; returns the events."""
        async with asyncio.timeout(within):
            while not done(self.events) and not self.closed:
                data = await self.reader.read(65536)
                if not data:
                    self.closed = True
                    break
                events = self.conn.receive_data(data)
                self.events += events
                for e in events:
                    if self.ack and isinstance(e, h2.events.DataReceived):
                        with contextlib.suppress(h2.exceptions.StreamClosedError):
                            self.conn.acknowledge_received_data(
                                e.flow_controlled_length, e.stream_id
                            )
                await self.flush()
        return self.events

    def body(self, sid: int) -> bytes:
        data = h2.events.DataReceived
        return b"".join(e.data for e in self.events if isinstance(e, data) and e.stream_id == sid)

    def status(self, sid: int) -> int:
        for e in self.events:
            if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid:
                return int(dict(e.headers)[":status"])  # type: ignore[index]
        return 0

    def ended(self, sid: int) -> bool:
        return any(
            isinstance(e, h2.events.StreamEnded | h2.events.StreamReset) and e.stream_id == sid
            for e in self.events
        )

    def goaway(self) -> int | None:
        """The error code of the server's GOAWAY, if it sent one."""
        for e in self.events:
            if isinstance(e, h2.events.ConnectionTerminated):
                return int(e.error_code) if e.error_code is not None else 0
        return None

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


SETTINGS = h2.settings.SettingCodes
