"""Every dialect, table-driven from transcripts written from each format's public docs.

Each transcript in tests/fixtures/streams/ is checked twice: through the pure decoder and
dialect at every split of its bytes (any chunking must give the same token events), and
through a live sidecar in front of the simulated engine replaying it on its schedule.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmobs.observe.dialects import detect_stream, route_for_path
from llmobs.observe.dialects.base import Dialect, loads
from llmobs.observe.dialects.openai import OpenAIStream
from llmobs.observe.framing import Framing, NdjsonDecoder, SseDecoder
from llmobs.sim.replay import REPLAY_HEADER, Transcript, build_replay_app, load_transcripts
from tests.support import FIXTURES
from tests.support.servers import AppFactory, SidecarFactory, eventually

TRANSCRIPTS = load_transcripts(FIXTURES / "streams")
IDS = [t.name for t in TRANSCRIPTS]
Event = list[Any]


def run(t: Transcript, pieces: list[bytes]) -> tuple[list[Event], Dialect]:
    """The token events (choice, tokens, kind) the dialect finds in ``pieces``."""
    dialect = route_for_path(t.path).dialect()
    events: list[Event] = []
    kind = detect_stream(t.content_type)
    if kind not in ("sse", "ndjson"):
        dialect.on_body(loads(b"".join(pieces)))
        return events, dialect
    decoder: Framing = SseDecoder() if kind == "sse" else NdjsonDecoder()

    def consume(payloads: list[bytes]) -> None:
        for payload in payloads:
            before = dialect.reasoning_chunks
            tokens = dialect.on_data(payload)
            if tokens:  # choice 0 unless the dialect put them in ``pending``
                ((choice, tokens),) = dialect.pending.items() or [(0, tokens)]
                dialect.pending.clear()
                events.append([choice, tokens, "reasoning" if dialect.reasoning_chunks > before
                               else "text"])  # fmt: skip

    for piece in pieces:
        consume(decoder.payloads(piece))
    consume(decoder.flush_payloads())
    return events, dialect


def check(t: Transcript, events: list[Event], dialect: Dialect) -> None:
    x = t.expected
    assert events == x["events"]
    counted = sum(e[1] for e in events)
    total = dialect.output_tokens if dialect.output_tokens is not None else counted
    assert total == x["output_tokens"]
    assert ("usage" if dialect.output_tokens is not None else "counted") == x["token_source"]
    assert dialect.input_tokens == x["input_tokens"]
    assert dialect.finish_reason == x["finish_reason"]
    reasoning = dialect.reasoning_tokens
    if reasoning is None and dialect.reasoning_chunks:
        reasoning = dialect.reasoning_chunks
    assert (reasoning or 0) == x.get("reasoning_tokens", 0)
    assert (dialect.cached_tokens or 0) == x.get("cached_tokens", 0)
    assert dialect.engine_prompt_eval_s == pytest.approx(x.get("engine_prompt_eval_s"))
    assert dialect.engine_load_s == pytest.approx(x.get("engine_load_s"))
    assert dialect.malformed == 0


def test_every_dialect_has_a_transcript() -> None:
    names = {route_for_path(t.path).name for t in TRANSCRIPTS}
    assert names >= {"openai", "openai-responses", "anthropic", "tgi", "ollama", "none"}
    assert all(t.doc for t in TRANSCRIPTS)


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=IDS)
def test_transcript_at_every_split_point(t: Transcript) -> None:
    body = t.body
    for cut in range(len(body) + 1):
        check(t, *run(t, [body[:cut], body[cut:]]))


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=IDS)
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=30))
def test_transcript_under_any_chunking(t: Transcript, cuts: list[int]) -> None:
    body = t.body
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    check(t, *run(t, pieces))


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=IDS)
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
        first = next(i for i, c in enumerate(t.chunks) if _has_output(t, i))
        ttft = side.value("gen_ai_server_time_to_first_token_seconds_sum")
        assert ttft == pytest.approx(0.020 * first, abs=0.015)
    if "engine_prompt_eval_s" in x:
        assert side.value("llmobs_engine_prompt_eval_duration_seconds_sum") == pytest.approx(
            x["engine_prompt_eval_s"]
        )
    assert side.value("llmobs_stream_malformed_events_total") == 0
    assert side.value("llmobs_prefill_queue_depth") == 0


def _has_output(t: Transcript, index: int) -> bool:
    """Whether chunk ``index`` of ``t`` is the one carrying the first output event."""
    body = b"".join(data for _, data in t.chunks[: index + 1])
    events, _ = run(t, [body])
    return bool(events)


def test_an_anthropic_stream_cut_before_its_end_is_counted_by_its_chunks() -> None:
    """``message_start``'s output count is a placeholder (1 from Anthropic, 0 from vLLM): a
    stream the client left before ``message_delta`` must not report it as the engine's total."""
    dialect = route_for_path("/v1/messages").dialect()
    start = {"type": "message_start", "message": {"id": "m", "model": "claude",
             "usage": {"input_tokens": 10, "output_tokens": 1}}}  # fmt: skip
    delta = {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": "hi"}}  # fmt: skip
    assert dialect.on_data(as_json(start)) == 0
    assert sum(dialect.on_data(as_json(delta)) for _ in range(5)) == 5
    assert dialect.input_tokens == 10
    assert dialect.output_tokens is None  # counted, not the placeholder
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
           "usage": {"output_tokens": 5}}  # fmt: skip
    dialect.on_data(as_json(end))
    assert dialect.output_tokens == 5


def as_json(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_ollama_generate_counts_its_top_level_thinking_as_reasoning() -> None:
    """``/api/generate`` with ``"think": true`` streams reasoning in a top-level
    ``thinking`` field (``/api/chat`` in ``message.thinking``): it is output, timed as such."""
    dialect = route_for_path("/api/generate").dialect()
    think = {"model": "qwen3", "response": "", "thinking": "hmm", "done": False}
    answer = {"model": "qwen3", "response": "ok", "done": False}
    assert [dialect.on_data(as_json(think)) for _ in range(3)] == [1, 1, 1]
    assert dialect.on_data(as_json(answer)) == 1
    assert dialect.reasoning_chunks == 3
    assert dialect.on_data(as_json({"model": "qwen3", "response": "", "done": False})) == 0


def test_a_chunk_carrying_several_choices_counts_each() -> None:
    """vLLM sends one choice per chunk; a gateway may merge them: each choice's token is
    its own (accounted by its index), not one token of the first."""
    dialect = route_for_path("/v1/chat/completions").dialect()
    chunk = {"id": "c", "model": "m", "choices": [
        {"index": 0, "delta": {"content": "a"}},
        {"index": 1, "delta": {"content": "b"}},
        {"index": 2, "delta": {"reasoning_content": "c"}},
        {"index": 3, "delta": {}},
    ]}  # fmt: skip
    assert dialect.on_data(as_json(chunk)) == 3
    assert dialect.pending == {1: 1, 2: 1}  # choice 0's share is the rest
    assert dialect.reasoning_chunks == 1


@pytest.mark.parametrize(
    ("metrics", "queue", "prefill"),
    [
        ({"queue_time_ms": 12.5, "time_to_first_token_ms": 80}, 0.0125, 0.08),
        ({"queue_time_ms": -3, "time_to_first_token_ms": True}, 0.0, None),
        ({"generation_time_ms": 5}, None, None),
    ],
)
def test_vllm_per_request_metrics_give_the_engines_queue_and_prefill(
    metrics: dict[str, Any], queue: float | None, prefill: float | None
) -> None:
    """vLLM's ``metrics`` (--enable-per-request-metrics), on a stream's last chunk or in a
    whole body: a negative time is none, a value that is not a number is not read."""
    streamed = OpenAIStream()
    streamed.on_data(json.dumps({"id": "c", "choices": [], "metrics": metrics}).encode())
    whole = OpenAIStream()
    whole.on_body({"id": "c", "choices": [], "usage": {"completion_tokens": 1}, "metrics": metrics})
    for dialect in (streamed, whole):
        assert (dialect.engine_queue_s, dialect.engine_prompt_eval_s) == (queue, prefill)
