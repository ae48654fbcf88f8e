"""The dialects' package (``llmobs.observe.dialects``): which route a request path takes (its
operation and dialect, gateways' prefixes included), which framing a Content-Type gets, and
every transcript replayed through a live sidecar in front of the scripted engine, so that a
route, its framing and its dialect together give the counts and times the format promises.
Each dialect's own reading of its transcripts: its test module beside this one."""

from __future__ import annotations

import aiohttp
import pytest

from llmobs.observe.dialects import (
    ANTHROPIC,
    CHAT,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPERATIONS,
    OTHER_ROUTE,
    RESPONSES,
    TEXT_COMPLETION,
    TGI,
    TGI_COMPAT,
    TGI_STREAM,
    TRITON_STREAM,
    Route,
    detect_stream,
    route_for_path,
    route_for_request,
)
from llmobs.observe.dialects.base import MAX_MODEL_LENGTH, Passthrough
from llmobs.observe.labels import OTHER
from tests.support.replay import REPLAY_HEADER, Transcript, build_replay_app
from tests.support.servers import AppFactory, SidecarFactory, eventually
from tests.support.transcripts import TRANSCRIPTS, first_output_chunk


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v1/chat/completions", OPENAI_CHAT),
        ("/v1/completions", OPENAI_COMPLETIONS),
        ("/v1/responses", RESPONSES),
        ("/v1/messages", ANTHROPIC),
        ("/api/generate", OLLAMA_GENERATE),
        ("/api/chat", OLLAMA_CHAT),
        ("/generate_stream", TGI_STREAM),
        ("/generate", TGI),
        ("/openai/v1/chat/completions", OPENAI_CHAT),  # a gateway's prefix
        ("/v1/chat/completions/", OPENAI_CHAT),  # a trailing slash
        ("/ollama/api/chat//", OLLAMA_CHAT),
        ("/v1/embeddings", OTHER_ROUTE),
        ("/v1/messages/count_tokens", OTHER_ROUTE),
        ("/", OTHER_ROUTE),
        ("", OTHER_ROUTE),
    ],
)
def test_a_path_takes_the_route_its_suffix_names(path: str, route: Route) -> None:
    assert route_for_path(path) is route


def test_other_triton_paths_are_not_measured_and_a_long_model_is_cut() -> None:
    for path in ("/v2/models/ensemble/infer", "/v2/models/ensemble/versions/v1/generate",
                 "/v2/models//generate", "/v2/models/ensemble/ready"):  # fmt: skip
        assert route_for_path(path) is OTHER_ROUTE, path
    long = route_for_path("/v2/models/" + "m" * 10_000 + "/generate_stream")
    assert long.model == "m" * MAX_MODEL_LENGTH
    # a gateway's prefix that happens to hold /v2/models/: its OpenAI route still counts
    assert route_for_path("/v2/models/x/v1/chat/completions") is OPENAI_CHAT


def test_a_triton_route_is_its_kind_with_the_model_of_its_path() -> None:
    route = route_for_path("/v2/models/ensemble/versions/3/generate_stream")
    assert route == Route(TEXT_COMPLETION, TRITON_STREAM.dialect, "triton",
                          always_streams=True, model="ensemble")  # fmt: skip
    assert TRITON_STREAM.model is None  # the shared route is left as it was


@pytest.mark.parametrize(
    ("method", "path", "route"),
    [
        ("POST", "/", TGI_COMPAT),  # TGI's compat route, confirmed by the body's "inputs"
        ("POST", "", TGI_COMPAT),
        ("GET", "/", OTHER_ROUTE),
        ("POST", "/v1/chat/completions", OPENAI_CHAT),
        ("GET", "/v1/chat/completions", OPENAI_CHAT),  # the path decides, not the method
    ],
)
def test_a_request_takes_its_paths_route_but_a_post_to_the_root(
    method: str, path: str, route: Route
) -> None:
    assert route_for_request(method, path) is route
    assert TGI_COMPAT.confirm == b'"inputs"' and OPENAI_CHAT.confirm is None


@pytest.mark.parametrize(
    ("route", "flag", "streams"),
    [
        (OPENAI_CHAT, True, True),
        (OPENAI_CHAT, False, False),
        (OPENAI_CHAT, None, False),  # OpenAI answers whole unless asked
        (OPENAI_CHAT, "true", False),  # only JSON's true
        (OPENAI_CHAT, 1, False),
        (OLLAMA_CHAT, None, True),  # Ollama streams unless told not to
        (OLLAMA_CHAT, False, False),
        (TGI_STREAM, False, True),  # the path streams whatever the body says
        (TGI, True, True),
    ],
)
def test_a_route_says_whether_a_body_streams(route: Route, flag: object, streams: bool) -> None:
    assert route.streams(flag) is streams


def test_a_route_is_named_in_logs_by_its_operation_and_dialect() -> None:
    assert str(OPENAI_CHAT) == "chat/openai"
    assert str(RESPONSES) == "chat/openai-responses"
    assert str(OTHER_ROUTE) == "other/none"
    assert OPERATIONS == (CHAT, TEXT_COMPLETION, OTHER)
    assert OTHER_ROUTE.dialect is Passthrough


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("text/event-stream", "sse"),
        ("Text/Event-Stream; charset=utf-8", "sse"),
        (" text/event-stream ", "sse"),
        ("application/x-ndjson", "ndjson"),
        ("application/ndjson", "ndjson"),
        ("application/jsonl", "ndjson"),
        ("application/json", "json"),
        ("application/json; charset=utf-8", "json"),
        ("application/problem+json", "json"),
        ("text/plain", "other"),
        ("", "other"),
        ("text/event-streams", "other"),
    ],
)
def test_a_content_type_says_how_to_read_the_body(content_type: str, kind: str) -> None:
    assert detect_stream(content_type) == kind


def test_every_dialect_has_a_transcript() -> None:
    names = {route_for_path(t.path).name for t in TRANSCRIPTS}
    assert names >= {"openai", "openai-responses", "anthropic", "tgi", "ollama", "triton", "none"}
    assert all(t.doc for t in TRANSCRIPTS)


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=[t.name for t in TRANSCRIPTS])
async def test_transcript_through_the_live_sidecar(
    t: Transcript, start_app: AppFactory, start_sidecar: SidecarFactory
) -> None:
    upstream = await start_app(build_replay_app(TRANSCRIPTS))
    side = await start_sidecar(upstream)
    async with aiohttp.ClientSession() as s:
        headers = {REPLAY_HEADER: t.name}
        # the scripted upstream's first response in this process is slower than its script
        # (aiohttp's first-use work): not the sidecar's to time
        async with s.post(upstream + t.path, json=t.request, headers=headers) as r:
            await r.read()
        async with s.post(side.url + t.path, json=t.request, headers=headers) as r:
            assert r.status == t.status
            assert await r.read() == t.body
    await eventually(lambda: side.value("llmobs_requests_total") == 1)
    x = t.expected
    # a refused request's label is "error" where the body names no reason (finish_label)
    labels = {"gen_ai_operation_name": x["operation"], "outcome": x.get("outcome", "ok"),
              "finish_reason": x.get("finish_label", x["finish_reason"])}  # fmt: skip
    assert side.value("llmobs_requests_total", **labels) == 1
    if x["output_tokens"]:
        assert side.value("llmobs_tokens_total", gen_ai_token_type="output",
                          token_count_source=x["token_source"]) == x["output_tokens"]  # fmt: skip
    if x["input_tokens"] is not None:
        assert side.value("llmobs_tokens_total", gen_ai_token_type="input") == x["input_tokens"]
    for kind, key in (("reasoning", "reasoning_tokens"), ("cached_input", "cached_tokens")):
        assert side.value("llmobs_tokens_total", gen_ai_token_type=kind) == x.get(key, 0)
    assert side.value("llmobs_inter_token_latency_seconds_count") == x["itl_count"]
    if x["events"]:  # chunks 20 ms apart: TTFT at the first output chunk, ITLs ~20 ms a chunk
        ttft = side.value("gen_ai_server_time_to_first_token_seconds_sum")
        assert ttft == pytest.approx(0.020 * first_output_chunk(t), abs=0.015)
    if "engine_prompt_eval_s" in x:
        assert side.value("llmobs_engine_prompt_eval_duration_seconds_sum") == pytest.approx(
            x["engine_prompt_eval_s"]
        )
    assert side.value("llmobs_stream_malformed_events_total") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0
