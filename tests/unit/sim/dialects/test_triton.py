"""Triton's generate extension as the sim writes it (``sim.dialects.triton``), as
TensorRT-LLM's ensemble answers: ``data: `` and compact JSON per response, no ``[DONE]``, the
model and version of the path, request fields at the top level or in ``parameters``, the
token counts when asked, and ``/generate`` echoing the prompt unless told not to. The renderer
driven directly (exact bytes), and the sim over loopback."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from llmobs.sim.dialects.base import BadRequest, Chunk, Context
from llmobs.sim.dialects.triton import API, ENDPOINTS, Generate, error_body
from llmobs.sim.request import SimRequest
from tests.support.servers import SimFactory
from tests.support.sim_streams import FAST

CONTEXT = Context("sim", params={"model": "ensemble", "version": "3"})


def _generate(path_streams: bool, /, ctx: Context = CONTEXT, **body: Any) -> Generate:
    """A request on generate_stream (True) or generate (False)."""
    return Generate(json.dumps(body).encode(), path_streams, ctx)


JOB = SimRequest(seq=0, prompt_tokens=4, tokens=(" a", " b", " c"), finish_reason="stop")


# --- pure: the documents and the renderer ---------------------------------------------------


def test_the_routes_and_the_error_document() -> None:
    assert [e.path for e in ENDPOINTS] == [
        "/v2/models/{model}/generate_stream", "/v2/models/{model}/generate",
        "/v2/models/{model}/versions/{version:[0-9]+}/generate_stream",
        "/v2/models/{model}/versions/{version:[0-9]+}/generate",
    ]  # fmt: skip
    assert json.loads(error_body("no", 400)) == {"error": "no"}


def test_fields_at_the_top_level_win_over_parameters() -> None:
    parameters = {"max_tokens": 8, "return_num_output_tokens": True}
    exchange = _generate(True, text_input="x" * 9, max_tokens=4, seed=2, parameters=parameters)
    plan = exchange.plan
    assert (plan.prompt_tokens, plan.max_tokens, plan.seed) == (3, 4, 2)
    assert (exchange.counts, exchange.input_counts, exchange.echo) == (True, False, True)
    assert (exchange.model, exchange.version, exchange.stream) == ("ensemble", "3", True)
    bare = _generate(False, Context("sim"), text_input="hi")
    assert (bare.model, bare.version, bare.stream) == ("sim", "1", False)
    # only ``true`` itself turns an option on, as Triton reads a BOOL parameter
    assert not _generate(True, text_input="hi", return_num_output_tokens="yes").counts


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({}, "'text_input' is required and must be a string"),
        ({"parameters": {"text_input": 3}}, "'text_input' is required and must be a string"),
        ({"text_input": "hi", "parameters": "x"}, "'parameters' must be an object"),
        ({"text_input": "hi", "max_tokens": 0}, "'max_tokens' must be >= 1"),
        ({"text_input": "hi", "seed": -1}, "'seed' must be >= 0"),
    ],
)
def test_a_bad_request_names_what_is_wrong(body: dict[str, Any], problem: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _generate(True, **body)
    assert str(refused.value) == problem


def test_each_response_is_an_event_of_outputs_and_the_stream_just_ends() -> None:
    counted = _generate(True, text_input="hi", return_num_output_tokens=True,
                        return_num_input_tokens=True)  # fmt: skip
    assert counted.chunk(0, Chunk((" b", " c"), 1, True), JOB) == (
        b'data: {"model_name":"ensemble","model_version":"3","num_input_tokens":4,'
        b'"num_output_tokens":2,"text_output":" b c"}\n\n'
    )
    plain = _generate(True, text_input="hi")
    assert plain.chunk(0, Chunk((" a",), 0, False), JOB) == (
        b'data: {"model_name":"ensemble","model_version":"3","text_output":" a"}\n\n'
    )
    assert plain.head() == plain.tail([JOB]) == b""  # no [DONE]


@pytest.mark.parametrize(
    ("options", "text"),
    [({}, "hi a b c"), ({"exclude_input_in_output": True}, " a b c"),
     ({"parameters": {"exclude_input_in_output": True}}, " a b c"),
     ({"exclude_input_in_output": 1}, "hi a b c")],
)  # fmt: skip
def test_generate_echoes_the_prompt_unless_told_not_to(options: dict[str, Any], text: str) -> None:
    exchange = _generate(False, text_input="hi", return_num_output_tokens=True, **options)
    assert json.loads(exchange.full([JOB])) == {
        "model_name": "ensemble", "model_version": "3", "num_output_tokens": 3,
        "text_output": text,
    }  # fmt: skip


def test_the_client_request_names_its_model_in_the_path() -> None:
    path, body = API.request("org/llama 3", "hi", 5, True)
    assert path == "/v2/models/org%2Fllama%203/generate_stream"
    assert body == {"text_input": "hi", "max_tokens": 5, "stream": True,
                    "return_num_input_tokens": True, "return_num_output_tokens": True}  # fmt: skip
    assert API.request("org/llama 3", "hi", 5, False) == (path, body)


# --- over loopback: what a client reads -----------------------------------------------------


async def test_triton_names_the_model_of_its_path_and_counts_when_asked(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=7, output_tokens_max=7, tokens_per_chunk=3)
    body = {"text_input": "Say something.", "max_tokens": 7, "return_num_input_tokens": True,
            "return_num_output_tokens": True}  # fmt: skip
    url = sim.url + "/v2/models/ensemble/versions/3/generate_stream"
    async with http.post(url, json=body) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        raw = await resp.read()
    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e]
    assert raw.startswith(b"data: {") and b"[DONE]" not in raw
    assert {(e["model_name"], e["model_version"]) for e in events} == {("ensemble", "3")}
    # the first token alone, then tokens_per_chunk per response, each counted
    assert [e["num_output_tokens"] for e in events] == [1, 3, 3]
    assert {e["num_input_tokens"] for e in events} == {4}
    # /generate answers once, the prompt before the output unless told not to
    async with http.post(sim.url + "/v2/models/m/generate", json=body) as resp:
        whole = await resp.json()
    assert whole["text_output"].startswith("Say something.")
    assert whole["num_output_tokens"] == 7
    no_echo = {**body, "parameters": {"exclude_input_in_output": True}}
    async with http.post(sim.url + "/v2/models/m/generate", json=no_echo) as resp:
        assert not (await resp.json())["text_output"].startswith("Say")
    async with http.post(sim.url + "/v2/models/m/generate", json={"max_tokens": 3}) as resp:
        assert resp.status == 400
        assert "text_input" in (await resp.json())["error"]
