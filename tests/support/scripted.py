"""A scripted upstream: an HTTP server that sends exactly the bytes, at exactly the times, a
test prescribes, then ends cleanly, resets, or hangs. Pick the script with ``X-Script``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True)
class Script:
    """Response status and headers, then ``(delay_s, bytes)`` steps, then ``end``."""

    steps: tuple[tuple[float, bytes], ...] = ()
    status: int = 200
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "text/event-stream"),)
    end: str = "eof"  # eof | reset | hang
    header_delay: float = 0.0
    content_length: bool = False

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.steps)


@dataclass
class Received:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ScriptedUpstream:
    scripts: dict[str, Script] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    disconnected: int = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{path:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(
            Received(request.method, request.raw_path, dict(request.headers), body)
        )
        script = self.scripts.get(request.headers.get("X-Script", "default"))
        if script is None:
            return web.json_response({"path": request.raw_path, "size": len(body)})
        resp = web.StreamResponse(status=script.status, headers=dict(script.headers))
        if script.content_length:
            resp.content_length = len(script.body)
        try:
            if script.header_delay:
                await asyncio.sleep(script.header_delay)
            await resp.prepare(request)
            for delay, data in script.steps:
                if delay:
                    await asyncio.sleep(delay)
                await resp.write(data)
            if script.end == "reset":
                assert request.transport is not None
                request.transport.abort()
                return resp
            if script.end == "hang":
                await asyncio.sleep(3600)
            await resp.write_eof()
        except asyncio.CancelledError:
            self.disconnected += 1
            raise
        except ConnectionError:
            self.disconnected += 1
        return resp


def sse(*payloads: bytes | str) -> list[bytes]:
    """``data: ...`` events for each payload."""
    out = []
    for p in payloads:
        raw = p.encode() if isinstance(p, str) else p
        out.append(b"data: " + raw + b"\n\n")
    return out


def chat_chunk(text: str, idx: int = 0) -> str:
    return (
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
        f'"choices":[{{"index":{idx},"delta":{{"content":"{text}"}},"finish_reason":null}}]}}'
    )
