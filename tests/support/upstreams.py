"""Upstreams written by hand for the tests: a raw HTTP/1.1 server whose every answer a test
scripts byte by byte (``raw_upstream``), and the chat request and SSE answer most tests use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

Respond = Callable[[asyncio.StreamWriter, int], Awaitable[bool]]  # -> keep the connection


@dataclass
class RawUpstream:
    """An HTTP/1.1 server written by hand: each request gets ``respond``'s bytes."""

    respond: Respond
    connections: int = 0
    requests: int = 0
    heads: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.requests += 1
                if not await self.respond(writer, self.requests):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_upstream(respond: Respond) -> AsyncIterator[tuple[RawUpstream, str]]:
    upstream = RawUpstream(respond)
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield upstream, f"http://127.0.0.1:{port}"
    finally:
        server.close()


def chunked_sse(n: int) -> bytes:
    events = [
        b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i for i in range(n)
    ]
    events.append(b"data: [DONE]\n\n")
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def keep_alive(writer: asyncio.StreamWriter, _: int) -> bool:
    writer.write(SSE_HEAD + b"\r\n" + chunked_sse(3))
    await writer.drain()
    return True


async def post(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with session.post(url + "/v1/chat/completions", json=BODY) as r:
        return r.status, await r.read()
