"""The simulated engine's answers as a client reads them, in every dialect: each SSE event or
NDJSON line with its arrival time, the request that streams in each dialect, and which frames
carry tokens and what count each reports. The sim's dialect tests share them
(tests/unit/sim/dialects/)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

FAST: dict[str, Any] = {"prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001}
# prefill 100 ms, then one token every 20 ms, one request at a time
SCHEDULE: dict[str, Any] = {
    "max_batch": 1, "prefill_base": 0.1, "prefill_per_token": 0.0, "decode_base": 0.02,
    "decode_per_seq": 0.0,
}  # fmt: skip
MESSAGES = [{"role": "user", "content": "Say something."}]  # 14 characters: 4 prompt tokens
WORD = re.compile(r" [a-z]+")  # one token of the sim's vocabulary

# One streaming request per dialect, each on its native path.
STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
    ),
    "ollama": ("/api/chat", {"model": "m", "messages": MESSAGES}),  # streams by default
    "tgi": ("/generate_stream", {"inputs": "Say something.", "parameters": {"details": True}}),
    "anthropic": ("/v1/messages", {"max_tokens": 999, "messages": MESSAGES, "stream": True}),
    "openai-responses": ("/v1/responses", {"input": "Say something.", "stream": True}),
    "triton": (
        "/v2/models/ensemble/generate_stream",
        {"text_input": "Say something.", "return_num_output_tokens": True},
    ),
}


@dataclass
class Frame:
    """One SSE event or NDJSON line, and when it arrived (seconds since the request)."""

    at: float
    event: str | None
    data: Any
    raw: bytes


async def collect(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], limit: int = 10_000
) -> list[Frame]:
    """POST and read the answer frame by frame: NDJSON lines or SSE events, by Content-Type.

    After ``limit`` frames the connection is closed, as a client that goes away does.
    """
    loop = asyncio.get_running_loop()
    sent = loop.time()
    frames: list[Frame] = []
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        ndjson = resp.headers["Content-Type"] == "application/x-ndjson"
        while len(frames) < limit:
            raw = await (resp.content.readline() if ndjson else resp.content.readuntil(b"\n\n"))
            if not raw:
                break
            frames.append(_frame(loop.time() - sent, raw, ndjson))
        if len(frames) >= limit:
            resp.close()
    return frames


def _frame(at: float, raw: bytes, ndjson: bool) -> Frame:
    if ndjson:
        assert raw.endswith(b"\n")
        return Frame(at, None, json.loads(raw), raw)
    assert raw.endswith(b"\n\n")
    event, data = None, None
    for line in raw[:-2].decode().split("\n"):
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        else:
            assert line.startswith("data:"), raw
            data = line.removeprefix("data:").removeprefix(" ")
    assert data is not None
    return Frame(at, event, data if data == "[DONE]" else json.loads(data), raw)


def token_frames(dialect: str, frames: list[Frame]) -> list[Frame]:
    """The frames of a stream that carry generated tokens, in each dialect's terms."""
    keep: dict[str, Callable[[Frame], bool]] = {
        "openai": lambda f: (
            f.data != "[DONE]"
            and bool(f.data["choices"])
            and "role" not in f.data["choices"][0].get("delta", {})
        ),
        "ollama": lambda f: not f.data["done"],
        "tgi": lambda f: True,
        "anthropic": lambda f: f.event == "content_block_delta",
        "openai-responses": lambda f: f.event == "response.output_text.delta",
        "triton": lambda f: True,
    }
    return [f for f in frames if keep[dialect](f)]


def token_text(dialect: str, frame: Frame) -> str:
    """The generated text a token frame carries (a chat delta's or a completion's)."""
    data = frame.data
    texts: dict[str, Callable[[], str]] = {
        "openai": lambda: data["choices"][0].get("text") or data["choices"][0]["delta"]["content"],
        "ollama": lambda: data["message"]["content"],
        "tgi": lambda: data["token"]["text"],
        "anthropic": lambda: data["delta"]["text"],
        "openai-responses": lambda: data["delta"],
        "triton": lambda: data["text_output"],
    }
    return texts[dialect]()


def reported_tokens(dialect: str, frames: list[Frame]) -> int:
    """The output token count a stream reports at its end, in each dialect's terms."""
    counts: dict[str, Callable[[], int]] = {
        "openai": lambda: frames[-2].data["usage"]["completion_tokens"],
        "ollama": lambda: frames[-1].data["eval_count"],
        "tgi": lambda: frames[-1].data["details"]["generated_tokens"] - 1,  # less the EOS
        "anthropic": lambda: frames[-2].data["usage"]["output_tokens"],
        "openai-responses": lambda: frames[-1].data["response"]["usage"]["output_tokens"],
        "triton": lambda: sum(f.data["num_output_tokens"] for f in frames),
    }
    return counts[dialect]()
