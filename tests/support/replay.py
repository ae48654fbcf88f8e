"""Replay: a recorded transcript sent byte for byte, on its schedule (tests only).

A transcript (tests/fixtures/streams/*.json) is a response written from an engine's public
documentation: status, content type and a list of ``{"delay_ms", "text"}`` chunks. Replaying
it over HTTP lets the sidecar be tested against every dialect with a known schedule, exactly
as it would meet a real engine; the same files drive the pure decoder tests.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

REPLAY_HEADER = "X-Replay"


@dataclass(frozen=True)
class Transcript:
    """One recorded response and what the sidecar should make of it."""

    name: str
    path: str
    status: int
    content_type: str
    chunks: tuple[tuple[float, bytes], ...]  # (delay before, in seconds; bytes)
    request: dict[str, Any]
    expected: dict[str, Any]
    doc: str = ""

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.chunks)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Transcript:
        chunks = tuple(
            (float(c.get("delay_ms", 0)) / 1000, str(c["text"]).encode()) for c in obj["chunks"]
        )
        return cls(
            name=str(obj["name"]),
            path=str(obj["path"]),
            status=int(obj.get("status", 200)),
            content_type=str(obj["content_type"]),
            chunks=chunks,
            request=dict(obj.get("request") or {}),
            expected=dict(obj.get("expected") or {}),
            doc=str(obj.get("doc", "")),
        )


def load_transcripts(folder: Path) -> list[Transcript]:
    """Every ``*.json`` transcript in ``folder``, sorted by name."""
    return [Transcript.from_json(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def build_replay_app(transcripts: list[Transcript]) -> web.Application:
    """Serve each transcript on its path; with several on one path, ``X-Replay`` picks one."""
    by_name = {t.name: t for t in transcripts}
    by_path: dict[str, Transcript] = {}
    for t in transcripts:
        by_path.setdefault(t.path, t)

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        chosen = request.headers.get(REPLAY_HEADER)
        transcript = by_name.get(chosen) if chosen else by_path.get(request.path)
        if transcript is None:
            raise web.HTTPNotFound(text="no transcript for this path")
        resp = web.StreamResponse(
            status=transcript.status, headers={"Content-Type": transcript.content_type}
        )
        await resp.prepare(request)
        for delay, data in transcript.chunks:
            if delay:
                await asyncio.sleep(delay)
            await resp.write(data)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handle)
    return app
