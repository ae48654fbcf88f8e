"""The errors the sidecar answers itself, in the shape of the API the request spoke
(``observe.dialects.errors``): Anthropic's error types by status, TGI's ``error_type``,
Ollama's and Triton's plain ``error``, and none of its own for OpenAI's shape (the wire's).
Each real SDK reading them: tests/e2e/test_error_shapes.py."""

from __future__ import annotations

import json

import pytest

from llmobs.observe.dialects.errors import error_body


@pytest.mark.parametrize("dialect", ["openai", "openai-responses", "none", "", "unknown"])
def test_the_openai_shape_and_unknown_dialects_are_the_wires(dialect: str) -> None:
    assert error_body(dialect, 502, "x") is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (408, "timeout_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (431, "invalid_request_error"),  # a client's error Anthropic names no type for
        (500, "api_error"),
        (502, "api_error"),  # the sidecar's own, the engine gone
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_anthropic_errors_carry_its_type_for_the_status(status: int, kind: str) -> None:
    body = error_body("anthropic", status, "big")
    assert body is not None
    assert json.loads(body) == {"type": "error", "error": {"type": kind, "message": "big"}}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "validation"),
        (413, "validation"),
        (502, "generation"),
        (503, "overloaded"),
        (504, "generation"),
    ],
)
def test_tgi_errors_carry_the_type_its_client_raises_on(status: int, kind: str) -> None:
    assert json.loads(error_body("tgi", status, "x") or b"") == {"error": "x", "error_type": kind}


@pytest.mark.parametrize("dialect", ["ollama", "triton"])
def test_ollama_and_triton_errors_are_a_plain_message(dialect: str) -> None:
    assert json.loads(error_body(dialect, 504, "slow") or b"") == {"error": "slow"}


def test_a_message_is_escaped_as_json() -> None:
    message = 'the "engine" said \\ no\n\u00e9'
    anthropic = json.loads(error_body("anthropic", 502, message) or b"")
    assert anthropic["error"]["message"] == message
    for dialect in ("tgi", "ollama"):
        body = error_body(dialect, 502, message)
        assert body is not None and body.isascii()
        assert json.loads(body)["error"] == message
