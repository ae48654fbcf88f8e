"""--inject-usage: the engine is asked for usage, the client never sees the answer."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
from hypothesis import given, settings
from hypothesis import strategies as st

from llmobs.relay.inject import UsageStripper, inject_usage
from tests.integration.llamacpp import masked
from tests.support import FIXTURES
from tests.support.replay import load_transcripts
from tests.support.scripted import Script, ScriptedUpstream, chat_chunk, sse
from tests.support.servers import AppFactory, SidecarFactory, SimFactory, eventually

USAGE_EVENT = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
STREAM = b"".join(sse(chat_chunk(" a"), chat_chunk(" b"))) + USAGE_EVENT + b"data: [DONE]\n\n"
CLIENT_SEES = b"".join(sse(chat_chunk(" a"), chat_chunk(" b"))) + b"data: [DONE]\n\n"


def test_inject_usage_rewrites_only_streaming_requests_without_usage_options() -> None:
    body = json.loads(inject_usage(b'{"stream": true, "stream_options": {"x": 1}}') or b"{}")
    assert body["stream_options"] == {"x": 1, "include_usage": True}
    assert inject_usage(b'{"stream": false}') is None
    assert inject_usage(b'{"stream": true, "stream_options": {"include_usage": false}}') is None
    assert (
        inject_usage(b'{"stream": true, "stream_options": {"continuous_usage_stats": true}}')
        is None
    )
    assert inject_usage(b"not json") is None


def test_a_body_that_cannot_be_written_again_goes_on_as_it_came() -> None:
    """Parsed, but not serialisable again: nested deeper than the encoder recurses (orjson
    reads 1,024 levels), or holding a lone surrogate (the stdlib's parser takes one); the
    request is then forwarded unchanged, not answered 502."""
    deep = b'{"stream":true,"x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert inject_usage(deep) is None
    assert inject_usage(b'{"stream":true,"messages":[{"content":"\\ud800"}]}') is None
    nested = b'{"stream":true,"x":' + b"[" * 100 + b"]" * 100 + b"}"
    assert json.loads(inject_usage(nested) or b"{}")["stream_options"] == {"include_usage": True}


def strip(chunks: list[bytes]) -> bytes:
    stripper = UsageStripper()
    return b"".join(stripper.feed(c) for c in chunks) + stripper.flush()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_stripper_removes_exactly_the_usage_event_under_any_chunking(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert strip(chunks) == CLIENT_SEES


def test_stripper_keeps_everything_else_verbatim() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    assert strip([crlf]) == CLIENT_SEES.replace(b"\n", b"\r\n")
    unterminated = b"data: partial"
    assert strip([CLIENT_SEES, unterminated]) == CLIENT_SEES + unterminated
    continuous = (
        b'data: {"choices":[{"delta":{"content":"x"}}],"usage":{"completion_tokens":1}}\n\n'
    )
    assert strip([continuous]) == continuous


def _transcript_body(name: str) -> bytes:
    (t,) = [t for t in load_transcripts(FIXTURES / "streams") if t.name == name]
    return t.body


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=8))
def test_llamacpp_timings_go_back_into_the_finish_chunk(cuts: list[int]) -> None:
    """llama-server's chat stream with usage (as --inject-usage asks for it) has its timings
    on the usage event; without usage, on the finish chunk. The client gets the latter."""
    asked = _transcript_body("llamacpp-server-chat-usage")
    plain = _transcript_body("llamacpp-server-chat")
    points = sorted({c % (len(asked) + 1) for c in cuts})
    chunks = [asked[a:b] for a, b in zip([0, *points], [*points, len(asked)], strict=True)]
    stripper = UsageStripper()
    got = b"".join(stripper.feed(c) for c in chunks) + stripper.flush()
    assert stripper.stripped == 1
    assert masked(got) == masked(plain)
    # the very timings the engine measured for this request, not a copy of anything else
    timings = re.search(rb'"timings":\{[^{}]*\}', asked)
    assert timings is not None and got.count(timings.group()) == 1


def test_a_finish_chunk_is_held_only_until_the_next_event() -> None:
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    stripper = UsageStripper()
    assert stripper.feed(finish) == b""  # held: the usage event may follow
    assert stripper.feed(b"data: [DONE]\n\n") == finish + b"data: [DONE]\n\n"
    stripper = UsageStripper()
    assert stripper.feed(finish) == b""
    assert stripper.flush() == finish  # the end of the stream releases it
    # vLLM's usage event has no timings: the finish chunk goes on unchanged
    stripper = UsageStripper()
    assert stripper.feed(finish + USAGE_EVENT) == finish


def _mask(body: bytes) -> bytes:
    body = re.sub(rb'"id":"[a-z]+-[0-9a-f]+"', b'"id":"X"', body)
    return re.sub(rb'"created":\d+', b'"created":0', body)


async def test_client_gets_direct_bytes_and_the_sidecar_gets_usage(
    start_sim: SimFactory, start_sidecar: SidecarFactory
) -> None:
    sim = await start_sim(decode_base=0.002, prefill_base=0.001, tokens_per_chunk=3)
    side = await start_sidecar(sim.url, inject_usage=True)
    body: dict[str, Any] = {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "seed": 7, "max_tokens": 30,
    }  # fmt: skip
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/chat/completions", json=body) as r:
            direct = await r.read()
        async with s.post(side.url + "/v1/chat/completions", json=body) as r:
            proxied = await r.read()
    assert b'"usage"' not in direct
    assert _mask(proxied) == _mask(direct)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    # the engine's usage reached the sidecar: 30 tokens exactly, first chunk 1, then 3 each
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                      token_count_source="usage") == 30  # fmt: skip
    assert side.value("llmobs_inter_token_latency_seconds_count") == 29
    assert sim.engine.counters.last_headers  # sanity: the engine saw the request


async def test_engine_ignoring_the_option_falls_back_to_counting(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    chunks = CLIENT_SEES  # an engine that ignores include_usage (llama.cpp's Python server)
    up = ScriptedUpstream({"default": Script(((0.0, chunks),))})
    url = await start_app(up.app())
    side = await start_sidecar(url, inject_usage=True)
    async with aiohttp.ClientSession() as s:
        payload = {"model": "m", "stream": True, "messages": []}
        async with s.post(side.url + "/v1/chat/completions", json=payload) as r:
            assert await r.read() == chunks
    sent = json.loads(up.received[-1].body)
    assert sent["stream_options"] == {"include_usage": True}
    assert int(up.received[-1].headers["Content-Length"]) == len(up.received[-1].body)
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                      token_count_source="counted") == 2  # fmt: skip


async def test_nothing_is_rewritten_when_nothing_is_observed(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    """``--inject-usage`` with ``--no-instrument``: the usage would be asked for an
    observation that does not run, so the request goes upstream byte for byte."""
    up = ScriptedUpstream({"default": Script(((0.0, CLIENT_SEES),))})
    url = await start_app(up.app())
    side = await start_sidecar(url, inject_usage=True, instrument=False)
    body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            side.url + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as r,
    ):
        assert await r.read() == CLIENT_SEES
    assert up.received[-1].body == body


def test_a_held_finish_chunk_keeps_its_place_at_every_split() -> None:
    """Bytes after a held finish chunk (a third newline, here) go out after it, wherever the
    reads split; with no usage event the client gets the stream as it came."""
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    stream = b"".join(sse(chat_chunk(" a"))) + finish + b"\ndata: [DONE]\n\n"
    for cut in range(len(stream) + 1):
        assert strip([stream[:cut], stream[cut:]]) == stream, cut


def test_token_chunks_with_a_null_finish_reason_are_not_held() -> None:
    """vLLM's and llama.cpp's token chunks say "finish_reason":null: passed on at once."""
    token = b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
    assert UsageStripper().feed(token) == token


async def test_an_engine_that_breaks_after_its_finish_chunk_still_delivers_it(
    start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    """The stripper holds a finish chunk for the usage event; an engine that resets the
    connection right after it must not take it from the client."""
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    tokens = b"".join(sse(chat_chunk(" a"), chat_chunk(" b")))
    upstream = ScriptedUpstream({"default": Script(((0, tokens), (0.05, finish)), end="reset")})
    side = await start_sidecar(await start_app(upstream.app()), inject_usage=True)
    body = {"model": "m", "messages": [], "stream": True}
    got = b""
    async with aiohttp.ClientSession() as s, s.post(side.url + "/v1/chat/completions",
                                                    json=body) as r:  # fmt: skip
        try:
            async for chunk in r.content.iter_any():
                got += chunk
        except aiohttp.ClientPayloadError:
            pass  # cut, as the engine cut it
    assert got == tokens + finish
