"""The client leg's server (``llmobs.wire.server.ProxyServer``) with small test handlers, for
the tests of the client leg (tests/unit/wire/server/, request/, test_flow.py) and of the
relay's headers: start one (``serving``), and run a module's tests on uvloop too."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from llmobs.wire.http1 import BadRequest
from llmobs.wire.request import openai_error_body
from llmobs.wire.server import BodyTooLarge, BodyTooSlow, ProxyServer, Request
from tests.support.rawhttp import WAIT, Client

MAX_BODY = 1024
Handler = Callable[[Request], Awaitable[None]]


@dataclass
class Served:
    server: ProxyServer
    port: int
    clients: list[Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def connect(self, sock: socket.socket | None = None) -> Client:
        if sock is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        else:
            reader, writer = await asyncio.open_connection(sock=sock)
        client = Client(reader, writer)
        self.clients.append(client)
        return client


ServeFactory = Callable[..., Awaitable[Served]]


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[ServeFactory]:
    started: list[Served] = []

    async def start(
        handler: Handler, *, client_timeout: float = 10.0, max_body: int = MAX_BODY
    ) -> Served:
        server = ProxyServer(handler, client_timeout=client_timeout, max_body=max_body)
        port = await server.listen("127.0.0.1", 0)
        served = Served(server, port)
        started.append(served)
        return served

    yield start
    for served in started:
        for client in served.clients:
            client.writer.transport.abort()
        await served.server.shutdown(0.5)
        assert not served.server.connections


@dataclass
class Seen:
    """What the test handlers saw and how they ended."""

    requests: list[Request] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    errors: list[BaseException] = field(default_factory=list)

    @property
    def targets(self) -> list[str]:
        return [r.target for r in self.requests]


def echo(seen: Seen, budget: float = WAIT) -> Handler:
    """Reads the body, answers ``METHOD target`` and the body; errors as 413/408/400 (without
    asking for the connection to be closed: the server must know when it has to)."""

    async def handle(request: Request) -> None:
        seen.requests.append(request)
        seen.started.set()
        try:
            body = await request.read_body(budget)
        except (BodyTooLarge, BodyTooSlow, BadRequest) as exc:
            seen.errors.append(exc)
            status = {BodyTooLarge: 413, BodyTooSlow: 408}.get(type(exc), 400)
            request.respond(status, openai_error_body(status, type(exc).__name__))
            return
        line = f"{request.method} {request.target}\n".encode()
        request.respond(200, line + body, "text/plain")

    return handle


def streaming(seen: Seen, parts: list[bytes]) -> Handler:
    """An event stream written part by part with ``begin``/``write``/``end``."""

    async def handle(request: Request) -> None:
        seen.requests.append(request)
        request.begin(200, "OK", [("Content-Type", "text/event-stream")], None)
        for part in parts:
            request.write(part)
            await asyncio.sleep(0)
        request.end()

    return handle


def blocked(seen: Seen, release: asyncio.Event) -> Handler:
    """Waits for ``release`` before answering; notes its cancellation."""

    async def handle(request: Request) -> None:
        seen.requests.append(request)
        seen.started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            seen.cancelled.set()
            raise
        request.respond(200, b"released", "text/plain")

    return handle


def on_uvloop(module_name: str) -> Callable[..., None]:
    """A test that runs every test of ``module_name`` taking only ``serve`` again on uvloop
    (the relay's loop where installed), bar the known bugs: assign it to ``test_on_uvloop``
    at the end of the module."""
    module = sys.modules[module_name]
    cases = [
        fn
        for name, fn in vars(module).items()
        if name.startswith("test_")
        and "bug" not in name
        and "doubt" not in name
        and inspect.iscoroutinefunction(fn)
        and list(inspect.signature(fn).parameters) == ["serve"]
    ]

    @pytest.mark.parametrize("case", cases, ids=lambda fn: fn.__name__[5:])
    def test_on_uvloop(case: Callable[[ServeFactory], Awaitable[None]]) -> None:
        uvloop = pytest.importorskip("uvloop")

        async def main() -> None:
            assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
            async with serving() as serve:
                await case(serve)

        uvloop.run(main())

    return test_on_uvloop
