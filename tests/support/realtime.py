"""A realtime client (vLLM's ``/v1/realtime`` protocol, the ``websockets`` library) for tests
that need sessions going on: each session answers one turn whole and cuts the next short."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
from collections.abc import AsyncIterator

import websockets

CHUNK = base64.b64encode(bytes(3200)).decode()  # 100 ms of 16 kHz PCM16


def ws_url(url: str) -> str:
    """The realtime endpoint behind an http(s) base URL."""
    return url.replace("http", "ws", 1) + "/v1/realtime"


async def one_session(url: str, model: str, tls: ssl.SSLContext | None = None) -> None:
    """A session: one turn answered (done), a second cut short by the client's close."""
    async with websockets.connect(ws_url(url), ssl=tls) as ws:
        await ws.recv()  # session.created
        await ws.send(json.dumps({"type": "session.update", "model": model}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": CHUNK}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        while json.loads(await ws.recv())["type"] != "transcription.done":
            pass
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": CHUNK}))
        await ws.recv()  # its first delta: then the client leaves mid-turn


@contextlib.asynccontextmanager
async def realtime_load(
    url: str, model: str, tls: ssl.SSLContext | None = None
) -> AsyncIterator[None]:
    """Sessions one after another until the block ends."""

    async def loop() -> None:
        while True:
            with contextlib.suppress(OSError, websockets.WebSocketException):
                await one_session(url, model, tls)

    task = asyncio.ensure_future(loop())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
