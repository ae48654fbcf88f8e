"""Upstream faults (``llmobs/sim/faults.py``) through a sidecar.

For each fault the same request goes to the engine directly and through the sidecar: the
client gets what the direct client got (the same bytes, or the same kind of failure), or a
clear JSON error where the direct client got no response at all; the sidecar records exactly
one outcome, the right one; afterwards this process has no more open fds or asyncio tasks than
before, and its RSS stays flat when the faults are repeated.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from llmobs.sim.faults import FAULT_HEADER, LONG_LINE_BYTES
from tests.support.leaks import Usage, back_to, rss_bytes
from tests.support.ports import port_of, refused_port
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory

CHAT = "/v1/chat/completions"
FAST: dict[str, Any] = {
    "prefill_base": 0.001, "prefill_per_token": 0.0, "decode_base": 0.001, "decode_per_seq": 0.0,
}  # fmt: skip
READ_TIMEOUT = 0.5  # the sidecar's: how long it waits on a silent engine
HANG_PATIENCE = 1.5  # how long a direct client waits on a fault meant to hang it
TINY_TOKENS = 480  # ~215 bytes per event, one byte per HTTP chunk: > 100,000 chunks


def request_body(tokens: int) -> dict[str, Any]:
    """A streamed chat request whose words are fixed by its seed, direct or proxied."""
    return {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": tokens, "ignore_eos": True, "seed": 7,
    }  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """What a client saw: how the exchange ended, the status and headers, the body bytes."""

    kind: str  # complete | cut (headers, then no clean end) | hang | refused (no response)
    status: int
    headers: dict[str, str]
    body: bytes


async def call(url: str, fault: str, tokens: int = 8, patience: float = 10.0) -> Seen:
    status, headers, got = 0, {}, bytearray()
    kind = "complete"
    try:
        async with (
            asyncio.timeout(patience),
            aiohttp.ClientSession(auto_decompress=False) as s,
            s.post(url + CHAT, json=request_body(tokens), headers={FAULT_HEADER: fault}) as r,
        ):
            status, headers = r.status, dict(r.headers)
            async for chunk in r.content.iter_any():
                got += chunk
    except TimeoutError:
        kind = "hang"
    except aiohttp.ClientPayloadError:
        kind = "cut"
    except aiohttp.ClientConnectionError:
        kind = "cut" if status else "refused"
    return Seen(kind, status, headers, bytes(got))


def normal(seen: Seen) -> bytes:
    """The body decoded and with the per-request id and clock masked (the rest must match)."""
    data = seen.body
    if seen.headers.get("Content-Encoding") == "gzip":
        data = zlib.decompressobj(wbits=31).decompress(data)
    data = re.sub(rb"chatcmpl-[0-9a-f]+", b"chatcmpl-ID", data)
    return re.sub(rb'"created":\d+', b'"created":0', data)


@pytest.fixture
def closed_port() -> Iterator[str]:
    """A URL whose port refuses connections, and stays refusing, for the whole test."""
    with refused_port() as sock:
        yield f"http://127.0.0.1:{port_of(sock)}"


async def fixture_pair(
    start_sim: SimFactory, start_sidecar: SidecarFactory, upstream: str | None = None
) -> tuple[str, SidecarHandle]:
    sim = await start_sim(fault="header", **FAST)
    side = await start_sidecar(
        upstream or sim.url, read_timeout=READ_TIMEOUT, connect_timeout=1.0,
        engine_scrape_interval=0, gpu_sample_interval=0,
    )  # fmt: skip
    return (upstream or sim.url), side


# fault: (what a direct client sees, the outcome the sidecar records)
CASES = {
    "connection-refused": ("refused", "upstream_error"),  # a closed port, not a sim fault
    "reset-before-headers": ("refused", "upstream_error"),
    "headers-then-nothing": ("hang", "upstream_timeout"),
    "reset-mid-stream": ("cut", "upstream_error"),
    "stall-mid-stream": ("hang", "upstream_timeout"),
    "truncated-chunked": ("cut", "upstream_error"),
    "invalid-utf8": ("complete", "ok"),
    "long-line": ("complete", "ok"),
    "tiny-chunks": ("complete", "ok"),
    "gzip": ("complete", "ok"),
    "http10-close": ("complete", "ok"),
}


@pytest.mark.parametrize("fault", list(CASES))
async def test_upstream_fault_through_the_sidecar(
    start_sim: SimFactory, start_sidecar: SidecarFactory, fault: str, closed_port: str
) -> None:
    refused = fault == "connection-refused"
    upstream = closed_port if refused else None
    direct_url, side = await fixture_pair(start_sim, start_sidecar, upstream)
    if not refused:
        assert (await call(side.url, "")).kind == "complete"  # warm: a pooled connection
    baseline = Usage.now()
    expected_kind, outcome = CASES[fault]
    before = side.value("llmobs_requests_total")
    before_outcome = side.value("llmobs_requests_total", outcome=outcome)
    tokens = TINY_TOKENS if fault == "tiny-chunks" else 8
    # A stream that should hang gets 1.5 s to prove it; the others all the time they need.
    patience = HANG_PATIENCE if expected_kind == "hang" else 30.0
    direct = await call(direct_url, fault, tokens, patience=patience)
    proxied = await call(side.url, fault, tokens)
    assert direct.kind == expected_kind  # the fault does what it says

    if direct.kind == "refused":  # no response at all: the sidecar explains, in JSON
        assert (proxied.kind, proxied.status) == ("complete", 502)
        assert proxied.headers["Content-Type"].startswith("application/json")
        assert json.loads(proxied.body)["error"]["type"] == "upstream_error"
    else:  # the same status, headers and bytes, ending the same way (a hang is cut, in time)
        assert proxied.kind == ("cut" if direct.kind == "hang" else direct.kind)
        assert proxied.status == direct.status == 200
        for header in ("Content-Type", "Content-Encoding"):
            assert proxied.headers.get(header) == direct.headers.get(header)
        assert normal(proxied) == normal(direct)

    await back_to(baseline)  # every socket and task of the request is gone
    assert side.value("llmobs_requests_total") - before == 1  # exactly one outcome, the right one
    assert side.value("llmobs_requests_total", outcome=outcome) - before_outcome == 1
    assert side.value("llmobs_requests_active") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0
    malformed = side.value("llmobs_stream_malformed_events_total")
    assert malformed == (1 if fault in ("invalid-utf8", "long-line") else 0)  # gzip: not parsed
    if fault == "long-line":
        assert len(direct.body) > LONG_LINE_BYTES
    if fault == "tiny-chunks":  # one byte per HTTP chunk
        assert len(direct.body) >= 100_000
    if fault in ("invalid-utf8", "long-line", "tiny-chunks", "http10-close"):
        output = side.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output")
        assert output - 8 == tokens  # the warm-up's 8, then every token of this stream


async def test_memory_stays_flat_across_repeated_faults(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    _, side = await fixture_pair(start_sim, start_sidecar)
    faults = ("long-line", "reset-before-headers", "reset-mid-stream", "truncated-chunked",
              "invalid-utf8", "gzip", "http10-close")  # fmt: skip
    samples = []
    for _ in range(6):
        for fault in faults:
            await call(side.url, fault)
        gc.collect()
        samples.append(rss_bytes())
    # A leaked 10 MiB line per round would add 40 MiB after the first (warm-up) round.
    assert samples[-1] - samples[1] < 25 * 1024**2, [s // 1024**2 for s in samples]
    assert side.value("llmobs_requests_total") == 6 * len(faults)


async def test_fault_modes_none_header_and_every_request(start_sim: SimFactory) -> None:
    plain = await start_sim(**FAST)  # faults off: the header means nothing
    assert (await call(plain.url, "reset-before-headers")).kind == "complete"
    by_header = await start_sim(fault="header", **FAST)
    assert (await call(by_header.url, "")).kind == "complete"  # no fault named
    unknown = await call(by_header.url, "no-such-fault")
    assert unknown.status == 400
    assert b"reset-mid-stream" in unknown.body  # the valid names, for whoever mistyped
    always = await start_sim(fault="gzip", **FAST)  # every request, no header needed
    assert (await call(always.url, "")).headers.get("Content-Encoding") == "gzip"
