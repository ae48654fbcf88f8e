"""vLLM's realtime API in the sim (``/v1/realtime``): a WebSocket session whose deltas are the
engine's tokens, so that a realtime turn is timed by the same schedule as a request.

The protocol as vLLM serves it (``vllm/entrypoints/openai/realtime``): ``session.created`` on
connect; the client's ``session.update`` names the model; ``input_audio_buffer.commit`` starts
a turn; each ``input_audio_buffer.append`` (base64 PCM16) is a request in the engine, its
prompt one token per ``FRAME_BYTES`` of audio and ``TOKENS_PER_CHUNK`` tokens out, each token
a ``transcription.delta``; a commit with ``final`` ends the input, and once every chunk is
answered ``transcription.done`` carries the text and the usage. Mistakes are vLLM's ``error``
events. The deltas are sent the moment the engine emits them: the truth the sidecar's
timing of a turn is checked against.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from typing import Any

from aiohttp import WSMsgType, web

from llmobs.sim.engine import SimEngine
from llmobs.sim.request import EngineStopped, SimRequest

PATH = "/v1/realtime"
FRAME_BYTES = 640  # 20 ms of 16 kHz PCM16: one prompt token
TOKENS_PER_CHUNK = 2  # tokens the engine generates for each chunk of audio
MAX_MESSAGE = 16 * 1024**2  # as uvicorn's --ws-max-size


def _event(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


class _Turn:
    """One turn: its chunks go into the engine as they come and are answered in order."""

    def __init__(self, engine: SimEngine, ws: web.WebSocketResponse, seq: int) -> None:
        self.engine = engine
        self.ws = ws
        self.seq = seq
        self.chunks: asyncio.Queue[SimRequest | None] = asyncio.Queue()
        self.jobs: list[SimRequest] = []
        self.task = asyncio.create_task(self._answer())

    def append(self, audio: bytes) -> None:
        prompt = max(1, len(audio) // FRAME_BYTES)
        job = self.engine.submit(self.seq, prompt, TOKENS_PER_CHUNK)
        self.jobs.append(job)
        self.chunks.put_nowait(job)

    def end(self) -> None:
        self.chunks.put_nowait(None)

    async def _answer(self) -> None:
        # the client left, or the engine stopped: the turn ends unanswered
        with contextlib.suppress(ConnectionResetError, EngineStopped, RuntimeError):
            await self._deltas()

    async def _deltas(self) -> None:
        text: list[str] = []
        while (job := await self.chunks.get()) is not None:
            for _ in range(job.completion_tokens):
                token = await job.next_token()
                text.append(token)
                await self.ws.send_str(_event("transcription.delta", delta=token))
        prompt = sum(job.prompt_tokens for job in self.jobs)
        usage = {"prompt_tokens": prompt, "completion_tokens": len(text),
                 "total_tokens": prompt + len(text)}  # fmt: skip
        await self.ws.send_str(_event("transcription.done", text="".join(text), usage=usage))

    def cancel(self) -> None:
        if self.task.done():
            return
        self.task.cancel()
        for job in self.jobs:
            self.engine.cancel(job)


class _Session:
    """One client's session: its events, in order."""

    def __init__(self, engine: SimEngine, ws: web.WebSocketResponse, seq: int) -> None:
        self.engine = engine
        self.ws = ws
        self.seq = seq
        self.validated = False
        self.turn: _Turn | None = None  # the turn whose input is coming
        self.turns: list[_Turn] = []

    async def handle(self, text: str) -> None:
        try:
            event = json.loads(text)
        except ValueError:
            await self._error("Invalid JSON", "invalid_json")
            return
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "session.update":
            await self._update(event)
        elif kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            await self._commit(event)
        else:
            await self._error(f"Unknown event type: {kind}", "unknown_event")

    async def _update(self, event: dict[str, Any]) -> None:
        settings = self.engine.settings
        if event.get("model") not in (settings.model, *settings.lora_adapters):
            await self._error(f"The model `{event.get('model')}` does not exist.", "not_found")
            return
        self.validated = True

    async def _append(self, event: dict[str, Any]) -> None:
        try:
            audio = base64.b64decode(event.get("audio", ""), validate=True)
        except (binascii.Error, TypeError, ValueError):
            audio = b""
        if not audio or self.turn is None:
            await self._error("Invalid audio data", "invalid_audio")
            return
        self.turn.append(audio)

    async def _commit(self, event: dict[str, Any]) -> None:
        if not self.validated:
            await self._error("Model not validated. Send a session.update first.",
                              "model_not_validated")  # fmt: skip
            return
        if event.get("final"):
            if self.turn is not None:
                self.turn.end()
                self.turn = None
        elif self.turn is None:
            self.turn = _Turn(self.engine, self.ws, self.seq)
            self.turns.append(self.turn)

    async def _error(self, message: str, code: str) -> None:
        await self.ws.send_str(_event("error", error=message, code=code))

    def close(self) -> None:
        for turn in self.turns:
            turn.cancel()


def realtime_handler(engine_key: web.AppKey[SimEngine]) -> Any:
    """The ``/v1/realtime`` route's handler."""

    async def handle(request: web.Request) -> web.StreamResponse:
        engine = request.app[engine_key]
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE)
        await ws.prepare(request)
        session = _Session(engine, ws, engine.receive(request.headers))
        await ws.send_str(_event("session.created", id=f"sess-{session.seq}"))
        try:
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    await session.handle(message.data)
        except (ConnectionResetError, EngineStopped):
            pass
        finally:
            session.close()
        return ws

    return handle
