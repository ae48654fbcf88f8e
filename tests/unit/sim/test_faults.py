"""The sim's wire faults (``sim.faults``): which fault a request gets, and what a fault does to
the stream a client reads straight from the sim (through a sidecar:
``tests/e2e/test_faults.py``)."""

from __future__ import annotations

import gzip
from typing import Any

import aiohttp
import pytest

from llmobs.sim.faults import (
    FAULT_HEADER,
    FAULT_MODES,
    FAULTS,
    GZIP,
    HEADER,
    INVALID_UTF8,
    NONE,
    TINY_CHUNKS,
    fault_of,
)
from tests.support.servers import SimFactory

FAST: dict[str, Any] = {"prefill_base": 0.0, "prefill_per_token": 0.0, "decode_base": 0.001,
                        "output_tokens_min": 5, "output_tokens_max": 5}  # fmt: skip
BODY = {"messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_the_mode_picks_the_fault() -> None:
    assert (NONE, HEADER, *FAULTS) == FAULT_MODES
    assert fault_of(NONE, {FAULT_HEADER: GZIP}) is None  # off: the header is not read
    assert fault_of(GZIP, {}) == GZIP  # every request the same
    assert fault_of(HEADER, {}) is None  # no header: a normal answer
    assert fault_of(HEADER, {FAULT_HEADER: " Tiny-Chunks "}) == TINY_CHUNKS
    with pytest.raises(ValueError, match="unknown X-Sim-Fault 'nope'; expected one of reset-"):
        fault_of(HEADER, {FAULT_HEADER: "nope"})


async def _raw(start_sim: SimFactory, fault: str) -> tuple[bytes, list[int], str]:
    """The body as sent (not decoded), the size of each HTTP chunk, and the encoding."""
    sim = await start_sim(**FAST, fault=HEADER)
    sizes: list[int] = []
    body = b""
    async with aiohttp.ClientSession(auto_decompress=False) as http, http.post(
        sim.url + "/v1/chat/completions", json=BODY, headers={FAULT_HEADER: fault}
    ) as resp:  # fmt: skip
        async for data, _ in resp.content.iter_chunks():
            sizes.append(len(data))
            body += data
        return body, sizes, resp.headers.get("Content-Encoding", "")


async def test_content_faults_keep_the_stream_and_add_to_it(start_sim: SimFactory) -> None:
    plain, _, _ = await _raw(start_sim, "")
    assert plain.endswith(b"data: [DONE]\n\n")
    squeezed, _, encoding = await _raw(start_sim, GZIP)
    assert encoding == "gzip" and gzip.decompress(squeezed).endswith(b"data: [DONE]\n\n")
    odd, _, _ = await _raw(start_sim, INVALID_UTF8)
    assert b"\xff\xfe" in odd and odd.endswith(b"data: [DONE]\n\n")
    with pytest.raises(UnicodeDecodeError):
        odd.decode()
    tiny, sizes, _ = await _raw(start_sim, TINY_CHUNKS)
    assert tiny.endswith(b"data: [DONE]\n\n") and set(sizes) == {1}  # a byte an HTTP chunk
