"""Anthropic's Messages API as the sim writes it (``sim.dialects.anthropic``): the documented
sequence of named events, the three that open the stream before any token (the first byte is
not the first token, which a proxy timing these streams must get right), the stop reasons and
usage, and the error document. The renderer driven directly (exact bytes), and the sim over
loopback."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from llmobs.sim.dialects.anthropic import API, Messages, error_body
from llmobs.sim.dialects.base import BadRequest, Chunk, Context
from llmobs.sim.request import SimRequest
from tests.support.servers import SimFactory
from tests.support.sim_streams import FAST, MESSAGES, collect

PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # the API's spacing, kept as sent


def _messages(**body: Any) -> Messages:
    return Messages(json.dumps(body).encode(), Context("sim"))


def _job(*tokens: str, finish: str) -> SimRequest:
    return SimRequest(seq=0, prompt_tokens=1, tokens=tokens, finish_reason=finish)


# --- pure: the documents and the renderer ---------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (404, "not_found_error"), (500, "api_error")],
)
def test_errors_are_anthropics_documents(status: int, kind: str) -> None:
    assert json.loads(error_body("no", status)) == {
        "type": "error", "error": {"type": kind, "message": "no"},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"messages": MESSAGES}, "max_tokens: Field required"),
        ({"max_tokens": None, "messages": MESSAGES}, "max_tokens: Field required"),
        ({"max_tokens": 0, "messages": MESSAGES}, "'max_tokens' must be >= 1"),
        ({"max_tokens": 5}, "'messages' is required and must be a non-empty list"),
        ({"max_tokens": 5, "messages": MESSAGES, "system": 3}, "message content must be a"),
    ],
)
def test_a_bad_request_names_what_is_wrong(body: dict[str, Any], problem: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _messages(**body)
    assert str(refused.value).startswith(problem)


def test_the_system_prompt_counts_and_the_model_is_the_clients() -> None:
    system = [{"type": "text", "text": "x" * 8}]
    exchange = _messages(max_tokens=5, messages=MESSAGES, system=system, model="claude-x")
    assert (exchange.plan.prompt_tokens, exchange.plan.max_tokens) == (6, 5)
    assert (exchange.model, exchange.stream) == ("claude-x", False)
    assert exchange.id.startswith("msg_") and len(exchange.id) == len("msg_") + 24
    assert _messages(max_tokens=5, messages=MESSAGES).model == "sim"


def test_the_stream_opens_with_three_events_before_any_token() -> None:
    exchange = _messages(max_tokens=5, messages=MESSAGES, model="m", stream=True)
    start, block, ping = exchange.head().split(b"\n\n")[:3]
    assert start.startswith(b"event: message_start\ndata: ")
    assert json.loads(start.split(b"data: ")[1])["message"] == {
        "id": exchange.id, "type": "message", "role": "assistant", "content": [], "model": "m",
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 4, "output_tokens": 1},
    }  # fmt: skip
    assert block == (
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}'
    )
    assert ping + b"\n\n" == PING


@pytest.mark.parametrize(("finish", "stop"), [("stop", "end_turn"), ("length", "max_tokens")])
def test_each_chunk_is_a_delta_and_the_tail_says_why_it_stopped(finish: str, stop: str) -> None:
    exchange = _messages(max_tokens=5, messages=MESSAGES, stream=True)
    job = _job(" a", " b", finish=finish)
    assert exchange.chunk(0, Chunk((" a", " b"), 0, True), job) == (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":" a b"}}\n\n'
    )
    assert exchange.tail([job]) == (
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"'
        + stop.encode()
        + b'","stop_sequence":null},"usage":{"output_tokens":2}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    whole = json.loads(exchange.full([job]))
    assert whole["content"] == [{"type": "text", "text": " a b"}]
    assert (whole["stop_reason"], whole["usage"]) == (stop, {"input_tokens": 4, "output_tokens": 2})


def test_the_client_request_streams_a_message() -> None:
    """The API has no plain completions: a chat either way."""
    want = ("/v1/messages", {"model": "m", "max_tokens": 5, "stream": True,
                             "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert API.request("m", "hi", 5, True) == API.request("m", "hi", 5, False) == want


# --- over loopback: what a client reads -----------------------------------------------------


async def test_anthropic_stream_is_the_documented_sequence(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=9, output_tokens_max=9, tokens_per_chunk=3)
    body = {"model": "claude-x", "max_tokens": 100, "messages": MESSAGES, "stream": True}
    frames = await collect(http, sim.url + "/v1/messages", body)

    names = [f.event for f in frames]
    deltas = ["content_block_delta"] * 4  # 1, 3, 3, 2 tokens
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(f.data["type"] == f.event for f in frames)
    assert frames[2].raw == PING
    start = frames[0].data["message"]
    assert start["id"].startswith("msg_")
    assert (start["model"], start["role"], start["content"]) == ("claude-x", "assistant", [])
    assert start["usage"] == {"input_tokens": 4, "output_tokens": 1}
    assert frames[1].data["content_block"] == {"type": "text", "text": ""}
    texts = [f.data["delta"]["text"] for f in frames[3:7]]
    assert [len(t.split()) for t in texts] == [1, 3, 3, 2]
    assert all(f.data["delta"]["type"] == "text_delta" for f in frames[3:7])
    assert frames[-2].data["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert frames[-2].data["usage"] == {"output_tokens": 9}


async def test_anthropic_non_streaming_and_errors(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=9, output_tokens_max=9)
    body: dict[str, Any] = {"max_tokens": 4, "messages": MESSAGES, "system": "Be brief."}
    async with http.post(sim.url + "/v1/messages", json=body) as resp:
        message = await resp.json()
    async with http.post(sim.url + "/v1/messages", json={"messages": MESSAGES}) as resp:
        assert resp.status == 400
        error = await resp.json()

    assert message["type"] == "message"
    assert message["stop_reason"] == "max_tokens"
    assert message["stop_sequence"] is None
    assert len(message["content"][0]["text"].split()) == 4
    assert message["usage"] == {"input_tokens": 6, "output_tokens": 4}  # system counts too
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in error["error"]["message"]
