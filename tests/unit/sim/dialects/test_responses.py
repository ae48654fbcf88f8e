"""OpenAI's Responses API as the sim writes it (``sim.dialects.responses``): named events
numbered from 0, the two that open the stream before any token, the output item and content
part opened with the first token, ``response.completed`` or ``response.incomplete`` when the
cap cut the output, the usage object, and the OpenAI SDK reading all of it. The renderer
driven directly, and the sim over loopback."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from openai.types.responses import ResponseCompletedEvent, ResponseTextDeltaEvent

from llmobs.sim.dialects import openai
from llmobs.sim.dialects.base import BadRequest, Chunk, Context
from llmobs.sim.dialects.responses import API, ENDPOINTS, Response, usage
from llmobs.sim.request import SimRequest
from tests.support.servers import SimFactory
from tests.support.sim_streams import FAST, STREAMS, collect

CONTEXT = Context("sim", wall_clock=lambda: 1_700_000_000.5)


def _response(**body: Any) -> Response:
    return Response(json.dumps(body).encode(), CONTEXT)


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Each named event of ``raw``: its name and its data."""
    out = []
    for block in raw.split(b"\n\n")[:-1]:
        event, data = block.decode().split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


# --- pure: the documents and the renderer ---------------------------------------------------


def test_usage_is_the_responses_apis() -> None:
    assert usage(4, 6) == {
        "input_tokens": 4, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10,
    }  # fmt: skip


def test_errors_are_openais_documents() -> None:
    assert [e.error for e in ENDPOINTS] == [openai.error_body]


def test_the_request_read() -> None:
    items = [{"role": "user", "content": "abcd"},
             {"role": "user", "content": [{"type": "input_text", "text": "efgh"}]}]  # fmt: skip
    exchange = _response(input=items, instructions="ijkl", max_output_tokens=9, stream=True)
    assert (exchange.plan.prompt_tokens, exchange.plan.max_tokens, exchange.stream) == (3, 9, True)
    assert (exchange.model, exchange.created_at) == ("sim", 1_700_000_000)
    assert exchange.id.startswith("resp_") and exchange.item_id.startswith("msg_")
    assert _response(input="hi", model="gpt-x").model == "gpt-x"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({}, "'input' is required and must be a string or a non-empty list of items"),
        ({"input": []}, "'input' is required and must be a string or a non-empty list of items"),
        ({"input": ["hi"]}, "'input' is required and must be a string or a non-empty list"),
        ({"input": "hi", "instructions": 3}, "'instructions' must be a string"),
        ({"input": "hi", "max_output_tokens": 0}, "'max_output_tokens' must be >= 1"),
    ],
)
def test_a_bad_request_names_what_is_wrong(body: dict[str, Any], problem: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _response(**body)
    assert str(refused.value).startswith(problem)


@pytest.mark.parametrize(("finish", "status"), [("stop", "completed"), ("length", "incomplete")])
def test_the_events_are_numbered_from_0_and_end_in_the_status(finish: str, status: str) -> None:
    exchange = _response(input="hi", stream=True, max_output_tokens=2)
    job = SimRequest(seq=0, prompt_tokens=1, tokens=(" a", " b"), finish_reason=finish)
    raw = exchange.head() + exchange.chunk(0, Chunk((" a",), 0, False), job)
    raw += exchange.chunk(0, Chunk((" b",), 1, True), job) + exchange.tail([job])
    events = _events(raw)
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", f"response.{status}",
    ]  # fmt: skip
    assert [data["sequence_number"] for _, data in events] == list(range(10))
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["response"]["status"] == "in_progress"
    final = events[-1][1]["response"]
    assert final == json.loads(exchange.full([job]))
    assert (final["status"], final["usage"]["output_tokens"]) == (status, 2)
    reason = {"reason": "max_output_tokens"} if status == "incomplete" else None
    assert final["incomplete_details"] == reason
    part = {"type": "output_text", "text": " a b", "annotations": []}
    assert final["output"] == [{"id": exchange.item_id, "type": "message", "status": status,
                                "role": "assistant", "content": [part]}]  # fmt: skip


def test_the_client_request_streams() -> None:
    want = ("/v1/responses",
            {"model": "m", "input": "hi", "max_output_tokens": 5, "stream": True})  # fmt: skip
    assert API.request("m", "hi", 5, True) == API.request("m", "hi", 5, False) == want


# --- over loopback: what a client reads -----------------------------------------------------


async def test_responses_stream_events_and_sequence_numbers(
    start_sim: SimFactory, http: aiohttp.ClientSession
) -> None:
    sim = await start_sim(**FAST, output_tokens_min=6, output_tokens_max=6)
    frames = await collect(http, sim.url + "/v1/responses", STREAMS["openai-responses"][1])

    assert [f.event for f in frames] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 6,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [f.data["sequence_number"] for f in frames] == list(range(len(frames)))
    assert all(f.data["type"] == f.event for f in frames)
    item_id = frames[2].data["item"]["id"]
    deltas = [f.data for f in frames[4:10]]
    assert all(
        d["item_id"] == item_id and d["output_index"] == d["content_index"] == 0 for d in deltas
    )
    text = "".join(d["delta"] for d in deltas)
    assert frames[10].data["text"] == text
    done = frames[-1].data["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0] == {
        "type": "output_text",
        "text": text,
        "annotations": [],
    }
    assert done["usage"] == usage(4, 6)


async def test_responses_capped_is_incomplete_and_the_sdk_reads_it(start_sim: SimFactory) -> None:
    sim = await start_sim(**FAST, output_tokens_min=6, output_tokens_max=6)
    async with AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as client:
        events = [
            event
            async for event in await client.responses.create(
                model="m", input=[{"role": "user", "content": "hello"}], stream=True
            )
        ]
        capped = await client.responses.create(model="m", input="hello", max_output_tokens=3)

    deltas = [e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) == 6
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert events[-1].response.output_text == "".join(deltas)
    assert capped.status == "incomplete"
    assert capped.incomplete_details is not None
    assert capped.incomplete_details.reason == "max_output_tokens"
    assert capped.usage is not None
    assert capped.usage.output_tokens == 3 == len(capped.output_text.split())
