"""Ollama's native API as the sim writes it (``sim.dialects.ollama``): NDJSON lines, streaming
unless told not to, the last line ``done`` with its reason, counters and the durations of the
engine's own schedule (so a proxy reading them can be checked against its own timing), and
``num_predict`` as Ollama reads it. The renderer driven directly (exact lines, a fixed wall
clock), and the sim over loopback."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
import pytest

from llmobs.sim.dialects.base import BadRequest, Chunk, Context
from llmobs.sim.dialects.ollama import (
    API,
    LOAD_DURATION_NS,
    Chat,
    Generate,
    durations,
    error_body,
)
from llmobs.sim.request import SimRequest, token_id
from tests.support.servers import SimFactory
from tests.support.sim_streams import FAST, MESSAGES, WORD, collect

CONTEXT = Context("sim", wall_clock=lambda: 1_700_000_000.5)
CREATED = "2023-11-14T22:13:20.500000Z"  # RFC 3339 in UTC, as Go writes a time.Time


def _generate(**body: Any) -> Generate:
    return Generate(json.dumps(body).encode(), CONTEXT)


def _job(*tokens: str, finish: str = "stop") -> SimRequest:
    job = SimRequest(seq=0, prompt_tokens=3, tokens=tokens, finish_reason=finish)
    job.prefill_started_at, job.first_token_at, job.last_token_at = 1.0, 1.5, 3.0
    return job


# --- pure: the documents and the renderer ---------------------------------------------------


def test_an_error_is_a_bare_string_whatever_the_status() -> None:
    for status in (400, 404, 500):
        assert json.loads(error_body("no", status)) == {"error": "no"}


def test_durations_are_the_schedules_in_integer_nanoseconds() -> None:
    assert durations(_job(" a", " b")) == {
        "total_duration": LOAD_DURATION_NS + 500_000_000 + 1_500_000_000,
        "load_duration": LOAD_DURATION_NS,
        "prompt_eval_count": 3,
        "prompt_eval_duration": 500_000_000,  # prefill: its start to the first token
        "eval_count": 2,
        "eval_duration": 1_500_000_000,  # first token to last
    }


@pytest.mark.parametrize(
    ("options", "max_tokens"), [({}, None), ({"num_predict": 5}, 5), ({"num_predict": -1}, None),
                                ({"num_predict": -2}, None)],
)  # fmt: skip
def test_num_predict_caps_the_output_and_a_negative_one_does_not(
    options: dict[str, Any], max_tokens: int | None
) -> None:
    assert _generate(prompt="hi", options=options).plan.max_tokens == max_tokens


def test_the_request_read() -> None:
    exchange = _generate(prompt="x" * 8, system="abcd", options={"seed": 3})
    assert (exchange.stream, exchange.plan.prompt_tokens, exchange.plan.seed) == (True, 3, 3)
    assert not _generate(prompt="hi", stream=False).stream  # streams unless told not to
    chat = Chat(json.dumps({"messages": MESSAGES}).encode(), CONTEXT)
    assert (chat.stream, chat.plan.prompt_tokens) == (True, 4)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"prompt": "hi", "options": {"num_predict": 0}}, "'num_predict' must not be 0"),
        ({"prompt": "hi", "options": "fast"}, "'options' must be an object"),
        ({"prompt": "hi", "options": {"seed": "1"}}, "'seed' must be an integer"),
        ({}, "'prompt' is required and must be a string"),
        ({"prompt": "hi", "system": 3}, "'prompt' is required and must be a string"),
    ],
)
def test_a_bad_request_names_what_is_wrong(body: dict[str, Any], problem: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _generate(**body)
    assert str(refused.value) == problem


def test_generate_writes_a_line_per_chunk_and_a_final_line_with_context() -> None:
    exchange = _generate(model="llama3", prompt="hi")
    job = _job(" lorem", " ipsum", finish="length")
    assert exchange.head() == b""
    assert exchange.chunk(0, Chunk((" lorem",), 0, False), job) == (
        b'{"model":"llama3","created_at":"' + CREATED.encode()
        + b'","response":" lorem","done":false}\n'
    )  # fmt: skip
    final = exchange.tail([job])
    assert final.endswith(b"}\n") and final.count(b"\n") == 1
    assert json.loads(final) == {
        "model": "llama3", "created_at": CREATED, "response": "", "done": True,
        "done_reason": "length", "context": [token_id(" lorem"), token_id(" ipsum")],
        **durations(job),
    }  # fmt: skip
    whole = json.loads(exchange.full([job]))
    assert (whole["response"], whole["done"]) == (" lorem ipsum", True)


def test_chat_writes_an_assistant_message_and_no_context() -> None:
    exchange = Chat(json.dumps({"messages": MESSAGES}).encode(), CONTEXT)
    job = _job(" a")
    line = json.loads(exchange.chunk(0, Chunk((" a",), 0, True), job))
    assert line == {"model": "sim", "created_at": CREATED,
                    "message": {"role": "assistant", "content": " a"}, "done": False}  # fmt: skip
    final = json.loads(exchange.tail([job]))
    assert final["message"] == {"role": "assistant", "content": ""}
    assert (final["done_reason"], "context" in final) == ("stop", False)


def test_the_client_request_streams_by_default() -> None:
    assert API.request("m", "hi", 5, True) == ("/api/chat", {
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "options": {"num_predict": 5},
    })  # fmt: skip
    assert API.request("m", "hi", 5, False) == (
        "/api/generate", {"model": "m", "prompt": "hi", "options": {"num_predict": 5}})  # fmt: skip


# --- over loopback: what a client reads -----------------------------------------------------


async def test_ollama_generate_streams_ndjson_with_counters(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=12, output_tokens_max=12, tokens_per_chunk=2)
    body = {"model": "llama3", "prompt": "x" * 9, "options": {"seed": 3}}
    frames = await collect(http, sim.url + "/api/generate", body)

    *lines, final = [f.data for f in frames]
    assert [len(line["response"].split()) for line in lines] == [1, 2, 2, 2, 2, 2, 1]
    for line in lines:
        assert list(line) == ["model", "created_at", "response", "done"]
        assert line["model"] == "llama3"
        assert line["done"] is False
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line["created_at"])
    assert final["response"] == ""
    assert final["done"] is True
    assert final["done_reason"] == "stop"
    assert final["eval_count"] == 12 == len("".join(t["response"] for t in lines).split())
    assert final["prompt_eval_count"] == 3
    assert len(final["context"]) == 12
    assert all(isinstance(i, int) for i in final["context"])
    assert final["load_duration"] == 5_000_000
    parts = ("load_duration", "prompt_eval_duration", "eval_duration")
    assert final["total_duration"] == sum(final[p] for p in parts)

    async with http.post(sim.url + "/api/generate", json={**body, "stream": False}) as resp:
        assert resp.content_type == "application/json"
        whole = await resp.json()
    assert whole["response"] == "".join(t["response"] for t in lines)  # the same seed
    assert (whole["done"], whole["done_reason"], whole["eval_count"]) == (True, "stop", 12)


async def test_ollama_chat_and_num_predict(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=12, output_tokens_max=12)
    body = {"model": "m", "messages": MESSAGES, "options": {"num_predict": 5}}
    frames = await collect(http, sim.url + "/api/chat", body)

    *lines, final = [f.data for f in frames]
    assert len(lines) == 5
    assert all(line["message"]["role"] == "assistant" for line in lines)
    assert all(WORD.fullmatch(line["message"]["content"]) for line in lines)
    assert final["message"] == {"role": "assistant", "content": ""}
    assert (final["done_reason"], final["eval_count"], final["prompt_eval_count"]) == (
        "length",
        5,
        4,
    )
    assert "context" not in final  # /api/chat carries no context, as in Ollama

    async with http.post(sim.url + "/api/chat", json={**body, "stream": False}) as resp:
        whole = await resp.json()
    assert len(whole["message"]["content"].split()) == whole["eval_count"] == 5
