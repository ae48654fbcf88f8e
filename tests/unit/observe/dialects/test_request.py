"""What a request body says (``observe.dialects.request``): the model, the stream flag, the
sampling settings, the prompt only when captured; bounded work and bounded values whatever the
body. Which route a path takes: test_dialects.py."""

from __future__ import annotations

import pytest

from llmobs.observe.dialects import (
    ANTHROPIC,
    OLLAMA_GENERATE,
    OPENAI_CHAT,
    OTHER_ROUTE,
    TGI,
    TGI_STREAM,
    route_for_path,
)
from llmobs.observe.dialects.base import MAX_MODEL_LENGTH
from llmobs.observe.dialects.request import CONTENT_LIMIT, parse_request, truncate


def test_large_request_bodies_are_scanned_not_parsed() -> None:
    big = b'{"messages": [{"role": "user", "content": "%s"}], "model": "big-m", "stream": true}'
    info = parse_request(big % (b"x" * (3 << 20)))
    assert (info.model, info.stream) == ("big-m", True)
    assert parse_request(b"not json") == parse_request(b"[1]")
    # Ollama's routes stream unless told not to: a large body's "stream": false is heard
    info = parse_request(big.replace(b"true", b"false") % (b"x" * (3 << 20)), OLLAMA_GENERATE)
    assert info.stream is False
    assert parse_request(b'{"messages": []}', OLLAMA_GENERATE).stream is True


def test_a_model_name_is_cut_to_a_bounded_length() -> None:
    """A client's model name names spans and is a span attribute: a megabyte of it would make
    an OTLP batch too large to export."""
    info = parse_request(b'{"model": "%s", "stream": true}' % (b"m" * 100_000))
    assert info.model == "m" * MAX_MODEL_LENGTH


def test_the_settings_telemetry_may_use_are_read_from_each_api() -> None:
    info = parse_request(
        b'{"model": "m", "stream": true, "stream_options": {"include_usage": true},'
        b' "max_completion_tokens": 7, "temperature": 0.5, "messages": []}',
        OPENAI_CHAT,
    )
    assert info == (info._replace(prompt=None))
    assert (info.model, info.stream, info.include_usage) == ("m", True, True)
    assert (info.max_tokens, info.temperature) == (7, 0.5)
    ollama = parse_request(b'{"model": "o", "options": {"num_predict": 3}}', OLLAMA_GENERATE)
    assert (ollama.stream, ollama.max_tokens) == (True, 3)  # Ollama streams unless told not to
    tgi = parse_request(b'{"inputs": "hi", "parameters": {"max_new_tokens": 9}}', TGI)
    assert (tgi.stream, tgi.max_tokens) == (False, 9)
    assert parse_request(b"{}", TGI_STREAM).stream is True  # the path streams
    anthropic = parse_request(b'{"model": "c", "max_tokens": 5, "stream": false}', ANTHROPIC)
    assert (anthropic.model, anthropic.max_tokens, anthropic.stream) == ("c", 5, False)
    assert parse_request(b'{"max_tokens": true}', OTHER_ROUTE).max_tokens is None  # not a number


def test_the_prompt_is_read_only_when_captured_and_then_truncated() -> None:
    body = b'{"model": "m", "prompt": "%s"}' % (b"p" * 5000)
    assert parse_request(body, OPENAI_CHAT).prompt is None
    captured = parse_request(body, OPENAI_CHAT, capture=True).prompt
    assert captured == truncate("p" * 5000)
    assert captured is not None and len(captured) == CONTENT_LIMIT + 1  # and an ellipsis
    messages = parse_request(b'{"messages": [{"role": "user", "content": "hi"}]}', capture=True)
    assert messages.prompt == '[{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize(
    ("path", "model", "stream"),
    [
        ("/v2/models/ensemble/generate_stream", "ensemble", True),
        ("/v2/models/ensemble/versions/1/generate", "ensemble", False),
        ("/triton/v2/models/tensorrt_llm_bls/generate_stream/", "tensorrt_llm_bls", True),
        ("/v2/models/my model/versions/12/generate_stream", "my model", True),  # decoded
    ],
)
def test_triton_generate_paths_name_the_model(path: str, model: str, stream: bool) -> None:
    """Triton's body names no model: the path does, and the path's generate_stream streams."""
    route = route_for_path(path)
    assert (route.name, route.model, route.operation) == ("triton", model, "text_completion")
    body = b'{"text_input": "Hi", "parameters": {"max_tokens": 5, "temperature": 0.5}}'
    info = parse_request(body, route)
    assert (info.model, info.stream, info.max_tokens, info.temperature) == (model, stream, 5, 0.5)
    assert parse_request(b"not json", route).model == model
