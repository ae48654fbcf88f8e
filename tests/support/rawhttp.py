"""A raw HTTP/1.1 client for the tests: request bytes built by hand, responses read from a
stream with nothing of an HTTP library's leniency or normalisation (it would resolve dot
segments, merge headers, or hide a cut response)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

WAIT = 5.0  # the bound on any single wait: generous, for a shared 2-core machine


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(values) <= 1, f"{name} repeated: {values}"
        return values[0] if values else None


async def read_head(reader: asyncio.StreamReader) -> tuple[int, str, list[tuple[str, str]]]:
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = raw[:-4].decode("latin-1").split("\r\n")
    version, status, reason = lines[0].split(" ", 2)
    assert version == "HTTP/1.1"
    fields = [line.partition(":") for line in lines[1:]]
    return int(status), reason, [(k, v.strip()) for k, _, v in fields]


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT)
        size = int(line[:-2], 16)
        chunk = await asyncio.wait_for(reader.readexactly(size + 2), WAIT)
        assert chunk.endswith(b"\r\n")
        body += chunk[:-2]
        if not size:
            return bytes(body)


async def read_response(reader: asyncio.StreamReader, *, head_only: bool = False) -> Response:
    """One response, framed as its head says (a HEAD's: the head alone)."""
    status, reason, headers = await read_head(reader)
    response = Response(status, reason, headers, b"")
    if head_only or status in (100, 204, 304):
        return response
    length = response.header("Content-Length")
    if length is not None:
        response.body = await asyncio.wait_for(reader.readexactly(int(length)), WAIT)
    elif response.header("Transfer-Encoding") == "chunked":
        response.body = await read_chunked(reader)
    else:
        response.body = await read_to_eof(reader)
    return response


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes (a reset counts as a close)."""
    out = bytearray()
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), WAIT):
            out += chunk
    return bytes(out)


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection with nothing more said."""
    return await read_to_eof(reader) == b""


@dataclass
class Client:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await asyncio.wait_for(self.writer.drain(), WAIT)


def get(target: str = "/", *extra: str, version: str = "HTTP/1.1") -> bytes:
    lines = [f"GET {target} {version}", "Host: test", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def post(target: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {target} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def status_of(url: str, request: bytes) -> int:
    """The status a server at ``url`` answers ``request`` (raw bytes, sent as they are)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    try:
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), WAIT)
    finally:
        writer.close()
    return int(line.split(b" ")[1])
