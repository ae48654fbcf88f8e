"""A scripted HTTP/2 engine, for what no well-behaved gRPC server sends: each request stream
answered by a script of steps (a head, raw DATA, trailers, a reset, the connection closed),
over ``h2``'s server state machine. It keeps what each request sent, for the tests to check."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events

Fields = list[tuple[str, str]]
GRPC_HEAD: Fields = [(":status", "200"), ("content-type", "application/grpc")]


@dataclass(frozen=True)
class Step:
    """One step of an answer: ``kind`` is head, data, trailers, end, reset or close."""

    kind: str
    fields: Fields = field(default_factory=list)
    data: bytes = b""
    pause: float = 0.0  # seconds to wait before it


def head(fields: Fields = GRPC_HEAD, end: bool = False) -> Step:
    return Step("head_end" if end else "head", fields)


def data(payload: bytes, pause: float = 0.0) -> Step:
    return Step("data", data=payload, pause=pause)


def trailers(status: int = 0, message: str = "") -> Step:
    fields = [("grpc-status", str(status))] + ([("grpc-message", message)] if message else [])
    return Step("trailers", fields)


RESET = Step("reset")
CLOSE = Step("close")


def message(payload: bytes, compressed: bool = False) -> bytes:
    """A gRPC length-prefixed message."""
    return bytes([compressed]) + len(payload).to_bytes(4, "big") + payload


@dataclass
class Seen:
    """What the engine received: each request's header fields and body."""

    heads: list[Fields] = field(default_factory=list)
    bodies: list[bytearray] = field(default_factory=list)  # each as it grows


class _Engine(asyncio.Protocol):
    def __init__(self, script: Sequence[Step], seen: Seen, early: bool) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config)
        self.script, self.seen, self.early = script, seen, early
        self.transport: asyncio.Transport | None = None
        self.bodies: dict[int, bytearray] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.conn.initiate_connection()
        self._flush()

    def data_received(self, payload: bytes) -> None:
        for event in self.conn.receive_data(payload):
            if isinstance(event, h2.events.RequestReceived):
                self.seen.heads.append([(str(k), str(v)) for k, v in event.headers or []])
                self.bodies[event.stream_id] = body = bytearray()
                self.seen.bodies.append(body)
                if event.stream_ended is not None or self.early:
                    self._answer(event.stream_id)
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] += event.data or b""
                self.conn.acknowledge_received_data(
                    event.flow_controlled_length or 0, event.stream_id
                )
            elif isinstance(event, h2.events.StreamEnded) and not self.early:
                self._answer(event.stream_id)
        self._flush()

    def _answer(self, sid: int) -> None:
        asyncio.get_running_loop().create_task(self._play(sid))

    async def _play(self, sid: int) -> None:
        with contextlib.suppress(Exception):  # a sidecar gone meanwhile: nothing to play to
            for step in self.script:
                if step.pause:
                    await asyncio.sleep(step.pause)
                self._step(sid, step)
                self._flush()

    def _step(self, sid: int, step: Step) -> None:
        conn = self.conn
        if step.kind in ("head", "head_end"):
            conn.send_headers(sid, step.fields, end_stream=step.kind == "head_end")
        elif step.kind == "data":
            conn.send_data(sid, step.data)
        elif step.kind == "trailers":
            conn.send_headers(sid, step.fields, end_stream=True)
        elif step.kind == "end":
            conn.end_stream(sid)
        elif step.kind == "reset":
            conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        elif step.kind == "close" and self.transport is not None:
            self.transport.close()

    def _flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.conn.data_to_send())


@contextlib.asynccontextmanager
async def scripted_engine(
    script: Sequence[Step], early: bool = False
) -> AsyncIterator[tuple[str, Seen]]:
    """An h2c engine on a loopback port answering every request with ``script`` once its
    body has ended (``early``: once its head came): its URL, and what it saw."""
    seen = Seen()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Engine(script, seen, early), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2)
