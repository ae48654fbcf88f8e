"""Text Generation Inference's native API as the sim writes it (``sim.dialects.tgi``): ``data:``
with no space, one token per event whatever ``tokens_per_chunk``, ``index`` from 1, the EOS
token as a special token of its own step (counted in ``generated_tokens``, left out of
``generated_text``), ``details`` only when asked, ``POST /`` answering as huggingface_hub's
client expects, and 422s. The renderer driven directly (exact bytes), and the sim over
loopback."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from llmobs.sim.dialects.base import BadRequest, Chunk
from llmobs.sim.dialects.tgi import (
    API,
    ENDPOINTS,
    Compat,
    Generate,
    error_body,
    generated_text,
    token,
)
from llmobs.sim.request import EOS_TOKEN, EOS_TOKEN_ID, SimRequest
from tests.support.servers import SimFactory
from tests.support.sim_streams import FAST, WORD, collect


def _generate(path_streams: bool | None, /, **body: Any) -> Generate:
    """A request on /generate_stream (True), /generate (False) or POST / (None)."""
    return Generate(json.dumps(body).encode(), path_streams)


def _job(*tokens: str, finish: str = "stop") -> SimRequest:
    return SimRequest(seq=0, prompt_tokens=3, tokens=tokens, finish_reason=finish)


# --- pure: the documents and the renderer ---------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"), [(422, "validation"), (503, "overloaded"), (500, "generation")]
)
def test_errors_are_tgis_documents(status: int, kind: str) -> None:
    assert json.loads(error_body("no", status)) == {"error": "no", "error_type": kind}
    assert {e.bad_request_status for e in ENDPOINTS} == {422}  # TGI's validation status


def test_a_token_is_tgis_object_and_eos_is_special() -> None:
    assert token(" lorem") == {"id": 100, "text": " lorem", "logprob": -0.7, "special": False}
    assert token(" ipsum")["logprob"] == -0.725  # stable per id
    assert token(EOS_TOKEN) == {"id": EOS_TOKEN_ID, "text": "</s>", "logprob": 0.0,
                                "special": True}  # fmt: skip
    assert generated_text(_job(" a", " b", EOS_TOKEN)) == " a b"  # special tokens skipped


def test_the_request_read() -> None:
    body = {"inputs": "x" * 9, "parameters": {"max_new_tokens": 4, "seed": 0}}
    exchange = _generate(True, **body)
    plan = exchange.plan
    assert (plan.prompt_tokens, plan.max_tokens, plan.seed, plan.eos) == (3, 4, 0, True)
    assert (exchange.stream, exchange.details, exchange.one_token_per_event) == (True, False, True)
    assert not _generate(False, inputs="hi", stream=True).stream  # the path decides
    assert _generate(None, inputs="hi", stream=True).stream  # but POST / reads the body
    # /generate_stream reads only ``details``, /generate ``decoder_input_details`` too
    asked = {"inputs": "hi", "parameters": {"decoder_input_details": True}}
    assert (_generate(True, **asked).details, _generate(False, **asked).details) == (False, True)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({}, "'inputs' is required and must be a string"),
        ({"inputs": ["hi"]}, "'inputs' is required and must be a string"),
        ({"inputs": "hi", "parameters": 3}, "'parameters' must be an object"),
        ({"inputs": "hi", "parameters": {"seed": -1}}, "'seed' must be >= 0"),
        ({"inputs": "hi", "parameters": {"max_new_tokens": 0}}, "'max_new_tokens' must be >= 1"),
    ],
)
def test_a_bad_request_names_what_is_wrong(body: dict[str, Any], problem: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _generate(True, **body)
    assert str(refused.value) == problem


def test_each_token_is_an_event_and_the_last_carries_the_text_and_details() -> None:
    exchange = _generate(True, inputs="hi", parameters={"details": True, "seed": 7})
    job = _job(" lorem", EOS_TOKEN)
    first = exchange.chunk(0, Chunk((" lorem",), 0, False), job)
    assert first == (b'data:{"index":1,"token":{"id":100,"text":" lorem","logprob":-0.7,'
                     b'"special":false},"generated_text":null,"details":null}\n\n')  # fmt: skip
    last = json.loads(exchange.chunk(0, Chunk((EOS_TOKEN,), 1, True), job).removeprefix(b"data:"))
    assert (last["index"], last["token"]["special"], last["generated_text"]) == (2, True, " lorem")
    assert last["details"] == {
        "finish_reason": "eos_token", "generated_tokens": 2, "seed": 7, "input_length": 3
    }  # fmt: skip
    assert exchange.tail([job]) == b""  # the last token's event ends the stream
    plain = _generate(True, inputs="hi")
    ends = plain.chunk(0, Chunk((" lorem",), 0, True), _job(" lorem"))
    assert json.loads(ends.removeprefix(b"data:"))["details"] is None


def test_generate_answers_whole_and_post_slash_wraps_it_in_a_list() -> None:
    job = _job(" lorem", " ipsum", finish="length")
    assert json.loads(_generate(False, inputs="hi").full([job])) == {
        "generated_text": " lorem ipsum"
    }
    detailed = json.loads(_generate(False, inputs="hi", parameters={"details": True}).full([job]))
    assert detailed["details"] == {
        "finish_reason": "length", "generated_tokens": 2, "seed": None, "prefill": [],
        "tokens": [token(" lorem"), token(" ipsum")],
    }  # fmt: skip
    compat = Compat(b'{"inputs": "hi"}', stream=None)
    assert json.loads(compat.full([job])) == [{"generated_text": " lorem ipsum"}]


def test_the_client_request_streams_with_details() -> None:
    """TGI serves one model: the body names none."""
    want = ("/generate_stream",
            {"inputs": "hi", "parameters": {"max_new_tokens": 5, "details": True}})  # fmt: skip
    assert API.request("m", "hi", 5, True) == API.request("m", "hi", 5, False) == want


# --- over loopback: what a client reads -----------------------------------------------------


async def test_tgi_streams_one_token_per_event_and_ends_with_eos(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=7, output_tokens_max=7, tokens_per_chunk=3)
    body = {"inputs": "x" * 9, "parameters": {"details": True, "seed": 11}}
    frames = await collect(http, sim.url + "/generate_stream", body)

    assert all(f.raw.startswith(b'data:{"index":') for f in frames)  # no space, as TGI
    events = [f.data for f in frames]
    assert [e["index"] for e in events] == list(range(1, 9))  # tokens_per_chunk ignored
    words, eos = events[:-1], events[-1]
    assert all(WORD.fullmatch(e["token"]["text"]) and not e["token"]["special"] for e in words)
    assert all(e["generated_text"] is None and e["details"] is None for e in words)
    assert eos["token"] == {"id": 2, "text": "</s>", "logprob": 0.0, "special": True}
    assert eos["generated_text"] == "".join(e["token"]["text"] for e in words)
    assert eos["details"] == {
        "finish_reason": "eos_token",
        "generated_tokens": 8,  # 7 words and the EOS token
        "seed": 11,
        "input_length": 3,
    }

    capped = {"inputs": "hi", "parameters": {"max_new_tokens": 4}}
    events = [f.data for f in await collect(http, sim.url + "/generate_stream", capped)]
    assert len(events) == 4
    assert not any(e["token"]["special"] for e in events)
    assert events[-1]["details"] is None  # details only when asked for, as TGI does
    assert len(events[-1]["generated_text"].split()) == 4


async def test_tgi_generate_with_and_without_details(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=6, output_tokens_max=6)
    async with http.post(sim.url + "/generate", json={"inputs": "hi"}) as resp:
        plain = await resp.json()
    body = {"inputs": "hi", "parameters": {"details": True, "max_new_tokens": 6}}
    async with http.post(sim.url + "/generate", json=body) as resp:
        detailed = await resp.json()
    async with http.post(sim.url + "/generate", json={"parameters": {}}) as resp:
        assert resp.status == 422
        error = await resp.json()
    # POST / (huggingface_hub's InferenceClient): the body's ``stream`` picks the route.
    async with http.post(sim.url + "/", json={"inputs": "hi"}) as resp:
        compat = await resp.json()
    streamed = await collect(http, sim.url + "/", {"inputs": "hi", "stream": True})

    assert list(plain) == ["generated_text"]
    assert len(plain["generated_text"].split()) == 6
    details = detailed["details"]
    # 6 words would need a 7th step for EOS: max_new_tokens=6 ends the output by length.
    assert (details["finish_reason"], details["generated_tokens"]) == ("length", 6)
    assert details["prefill"] == []
    assert "".join(t["text"] for t in details["tokens"]) == detailed["generated_text"]
    assert error["error_type"] == "validation"
    assert "inputs" in error["error"]
    assert [list(c) for c in compat] == [["generated_text"]]
    assert [f.data["index"] for f in streamed] == list(range(1, 8))  # 6 words and EOS
