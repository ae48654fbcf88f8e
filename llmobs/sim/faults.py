"""Wire faults of the sim: an engine that breaks its HTTP responses in the ways real ones do.

Off by default. ``--fault NAME`` (``LLMOBS_SIM_FAULT``) breaks every completion request the
same way; ``--fault header`` lets each request pick its fault in an ``X-Sim-Fault`` header (no
header: a normal answer; an unknown name: 400), so one sim serves a whole fault matrix. The
request is parsed first (a bad body is still a 400), then broken:

``reset-before-headers``  the body is read, then the connection is reset (TCP RST)
``headers-then-nothing``  200 and headers, then silence (until the client leaves, or 1 h)
``reset-mid-stream``      a few writes of the real stream, then a reset
``stall-mid-stream``      a few writes, then silence (the engine request is dropped)
``truncated-chunked``     a few chunks, then a clean close without the last chunk (``0\\r\\n``)
``invalid-utf8``          the stream with an extra event holding bytes that are not UTF-8
``long-line``             the stream with an extra 10 MiB single-line event
``tiny-chunks``           the stream with every byte in its own HTTP chunk
``gzip``                  the stream gzip-compressed (``Content-Encoding: gzip``), flushed per write
``http10-close``          an HTTP/1.0 answer whose body ends when the connection closes
                          (written straight onto the transport: aiohttp cannot produce it)

"A few writes" is ``MID_WRITES``; a shorter response meets its fault at its end instead.
Content faults add events in the stream's framing (SSE, else NDJSON lines); they are meant for
streamed requests. Connection refused needs no sim: a closed port does it.

Imports nothing of the sim but ``request`` (what it breaks): ``sim.config`` reads ``FAULTS``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from llmobs.sim.request import SimRequest

RESET_BEFORE_HEADERS = "reset-before-headers"
HEADERS_THEN_NOTHING = "headers-then-nothing"
RESET_MID_STREAM = "reset-mid-stream"
STALL_MID_STREAM = "stall-mid-stream"
TRUNCATED_CHUNKED = "truncated-chunked"
INVALID_UTF8 = "invalid-utf8"
LONG_LINE = "long-line"
TINY_CHUNKS = "tiny-chunks"
GZIP = "gzip"
HTTP10_CLOSE = "http10-close"
FAULTS = (RESET_BEFORE_HEADERS, HEADERS_THEN_NOTHING, RESET_MID_STREAM, STALL_MID_STREAM,
          TRUNCATED_CHUNKED, INVALID_UTF8, LONG_LINE, TINY_CHUNKS, GZIP, HTTP10_CLOSE)  # fmt: skip
NONE = "none"
HEADER = "header"
FAULT_MODES = (NONE, HEADER, *FAULTS)
FAULT_HEADER = "X-Sim-Fault"

MID_WRITES = 3  # writes of the real stream before a mid-stream fault
LONG_LINE_BYTES = 10 * 1024**2
HANG_S = 3600.0  # "forever", bounded
_MID = frozenset({RESET_MID_STREAM, STALL_MID_STREAM, TRUNCATED_CHUNKED})


def fault_of(mode: str, headers: Mapping[str, str]) -> str | None:
    """The fault to inflict on a request, or None; ``ValueError`` for an unknown header value."""
    if mode == NONE:
        return None
    if mode != HEADER:
        return mode
    name = headers.get(FAULT_HEADER, "").strip().lower()
    if not name:
        return None
    if name not in FAULTS:
        raise ValueError(f"unknown {FAULT_HEADER} {name!r}; expected one of {', '.join(FAULTS)}")
    return name


class Out(Protocol):
    """Where a response body goes: ``web.StreamResponse`` or a faulty stand-in."""

    async def write(self, data: bytes) -> None: ...
    async def write_eof(self) -> None: ...


@dataclass(frozen=True)
class Faulted:
    """What a fault needs of the request it breaks (built by the server)."""

    media_type: str
    submit: Callable[[], list[SimRequest]]  # put the request in the engine
    render: Callable[[Out, list[SimRequest]], Awaitable[None]]  # write its whole answer
    cancel: Callable[[list[SimRequest]], None]  # take it out of the engine


class _Cut(Exception):
    """The fault ended the response; nothing more is written."""


def reset(request: web.Request) -> None:
    """Reset the connection: SO_LINGER 0 makes the close send RST instead of FIN."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _close(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()  # flushes what was written, then FIN


class _RawHttp10:
    """An HTTP/1.0 response written onto the transport: no length, no chunks, ends at close."""

    def __init__(self, request: web.Request, media_type: str) -> None:
        self._request = request
        self._head = f"HTTP/1.0 200 OK\r\nContent-Type: {media_type}\r\n\r\n".encode()

    async def write(self, data: bytes) -> None:
        transport = self._request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        transport.write(self._head + data if self._head else data)
        self._head = b""
        if transport.get_write_buffer_size() > 1 << 20:
            await asyncio.sleep(0.01)  # crude backpressure; the sim is not a throughput test

    async def write_eof(self) -> None:
        if self._head:
            await self.write(b"")
        _close(self._request)


class _Faulty:
    """Passes the real stream to ``out``, breaking it the way ``fault`` says."""

    def __init__(self, fault: str, out: Out, request: web.Request, sse: bool) -> None:
        self._fault = fault
        self._out = out
        self._request = request
        self._sse = sse
        self._writes = 0
        self._gzip = zlib.compressobj(wbits=31) if fault == GZIP else None

    async def write(self, data: bytes) -> None:
        if self._gzip is not None:
            data = self._gzip.compress(data) + self._gzip.flush(zlib.Z_SYNC_FLUSH)
        if self._fault == TINY_CHUNKS:
            for i in range(len(data)):
                await self._out.write(data[i : i + 1])
        else:
            await self._out.write(data)
        self._writes += 1
        if self._writes == 1 and self._fault in (INVALID_UTF8, LONG_LINE):
            await self._out.write(self._extra())
        if self._writes == MID_WRITES and self._fault in _MID:
            await self._break()

    async def write_eof(self) -> None:
        if self._fault in _MID:
            await self._break()
        if self._gzip is not None:
            await self._out.write(self._gzip.flush())
        await self._out.write_eof()

    def _extra(self) -> bytes:
        if self._fault == INVALID_UTF8:
            text = b"\xff\xfe\xc3\x28 not utf-8 \xed\xa0\x80"
        else:
            text = b"x" * LONG_LINE_BYTES
        if self._sse:
            return b'data: {"choices":[{"index":0,"delta":{"content":"' + text + b'"}}]}\n\n'
        return b'{"response":"' + text + b'","done":false}\n'

    async def _break(self) -> None:
        if self._fault == RESET_MID_STREAM:
            await asyncio.sleep(0.05)  # let what was written reach the client first
            reset(self._request)
        elif self._fault == TRUNCATED_CHUNKED:
            _close(self._request)
        else:
            raise _Stall
        raise _Cut


class _Stall(Exception):
    """Stop writing and stay silent (after the engine request is dropped)."""


async def serve_fault(request: web.Request, fault: str, job: Faulted) -> web.StreamResponse:
    """Answer ``request`` with ``fault`` inflicted on it."""
    resp = web.StreamResponse(headers={"Content-Type": job.media_type})
    if fault == RESET_BEFORE_HEADERS:
        reset(request)
        return resp  # aiohttp's attempt to send it finds the connection gone
    if fault == HEADERS_THEN_NOTHING:
        await resp.prepare(request)
        await asyncio.sleep(HANG_S)
        return resp
    out: Out
    if fault == HTTP10_CLOSE:
        out = _RawHttp10(request, job.media_type)
    else:
        if fault == GZIP:
            resp.headers["Content-Encoding"] = "gzip"
        await resp.prepare(request)
        out = resp
    jobs = job.submit()
    try:
        await job.render(_Faulty(fault, out, request, "event-stream" in job.media_type), jobs)
    except _Cut:
        job.cancel(jobs)
    except _Stall:
        job.cancel(jobs)
        await asyncio.sleep(HANG_S)
    except ConnectionResetError:
        job.cancel(jobs)  # a write found the client gone before aiohttp cancelled us
    except asyncio.CancelledError:
        job.cancel(jobs)  # the client went away: free the batch slot, as vLLM aborts
        raise
    return resp
