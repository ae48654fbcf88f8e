"""Clients that do not read, and sources that flood them: the tests of back-pressure on both
legs share them. ``small_receiver``, ``Flow``, ``flood`` and ``slow_read`` play a client and a
handler against the client leg's server (``wire.server``); ``Flood``, ``slow_client`` and
``read_events`` an engine and a client on either side of a whole sidecar."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field

from llmobs.wire.http1 import ChunkedBody
from llmobs.wire.server import Request
from tests.support.protocol_server import Handler, Served
from tests.support.rawhttp import WAIT, Client
from tests.support.upstreams import SSE_HEAD

# -- against the client leg's server --------------------------------------------------------


async def small_receiver(served: Served) -> Client:
    """A client whose socket buffers little, so that what it does not read piles up in the
    server's transport."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(
        asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port)), WAIT
    )
    return await served.connect(sock)


@dataclass
class Flow:
    """What a ``flood`` handler saw of its client's flow: the pause and resume it was told of
    (with the transport's buffer then), and how much it wrote."""

    paused: asyncio.Event = field(default_factory=asyncio.Event)
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[tuple[str, int]] = field(default_factory=list)
    written: int = 0


def flood(flow: Flow, chunk: int = 16 * 1024, early: int = 0, sndbuf: int | None = 4096) -> Handler:
    """Streams until told to pause (at most 64 MiB), then waits to be resumed and ends.
    ``early`` bytes go out before ``on_flow`` is called; ``sndbuf``: the socket's send
    buffer (None: the kernel's own, autotuned to a few MiB)."""

    async def handle(request: Request) -> None:
        transport = request.transport
        if sndbuf is not None:
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)

        def pause() -> None:
            flow.events.append(("pause", transport.get_write_buffer_size()))
            flow.paused.set()

        def resume() -> None:
            flow.events.append(("resume", transport.get_write_buffer_size()))
            flow.resumed.set()

        request.begin(200, "OK", [("Content-Type", "application/octet-stream")], None)
        if early:
            request.write(b"e" * early)
            flow.written += early
        request.on_flow(pause, resume)
        data = b"x" * chunk
        for _ in range(64 * 1024 * 1024 // chunk):
            if flow.paused.is_set():
                break
            request.write(data)
            flow.written += chunk
            await asyncio.sleep(0)
        await asyncio.wait_for(flow.resumed.wait(), WAIT * 2)
        request.on_flow(None, None)
        request.end()

    return handle


async def slow_read(client: Client, size: int, pause: float) -> bytes:
    """A whole chunked response, read ``size`` bytes at a time, ``pause`` s apart."""
    raw = bytearray()
    while not raw.endswith(b"\r\n0\r\n\r\n"):
        data = await asyncio.wait_for(client.reader.read(size), WAIT)
        assert data, f"cut off after {len(raw)} bytes"
        raw += data
        await asyncio.sleep(pause)
    return bytes(raw)


# -- through a sidecar ----------------------------------------------------------------------


@dataclass
class Flood:
    """An engine that streams ``total`` chunks of 65 kB as fast as the sidecar reads them,
    and notes how many it wrote and whether its connection was closed under it."""

    total: int
    silent: bool = False  # then neither end nor close until ``release``
    chunk: bytes = b"data: " + b"x" * 65_000 + b"\n\n"
    sent: int = 0
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, writer: asyncio.StreamWriter, _: int) -> bool:
        try:
            writer.write(SSE_HEAD + b"\r\n")
            for _ in range(self.total):
                writer.write(b"%x\r\n%s\r\n" % (len(self.chunk), self.chunk))
                await writer.drain()  # blocks while the sidecar does not read
                self.sent += 1
            if self.silent:
                await asyncio.wait_for(self.release.wait(), 30)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            self.cut.set()
            return False
        return True


async def slow_client(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client with a small receive buffer that has sent a streaming request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    return reader, writer


async def read_events(reader: asyncio.StreamReader, total: int) -> int:
    """Read until ``total`` whole events or the end. The body is decoded first (the sidecar
    re-frames partial reads, so chunk lines fall anywhere), and an event counts at its end:
    its head alone, or an end split across reads, is not miscounted."""
    await reader.readuntil(b"\r\n\r\n")  # the response head
    decoder = ChunkedBody()
    received, tail = 0, b""
    while received < total:
        data = await reader.read(1 << 20)
        if not data:
            break
        window = tail + decoder.feed(data)
        received += window.count(b"\n\n")
        tail = window[-1:]  # shorter than the mark: no mark is counted twice
    return received
