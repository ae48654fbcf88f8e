"""The errors the sidecar answers itself, in each API's own shape: with the engine gone (a 502)
each real SDK raises its own error type, carrying llmobs's message, rather than showing a
body it cannot read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anthropic
import huggingface_hub
import ollama
import openai
import pytest
from huggingface_hub.errors import GenerationError

from tests.support.ports import port_of, refused_port
from tests.support.servers import SidecarFactory

MESSAGE = "upstream unavailable"


@pytest.fixture
async def gone(start_sidecar: SidecarFactory) -> AsyncIterator[str]:
    """A sidecar whose engine is not there: every request gets the sidecar's 502."""
    with refused_port() as engine:
        side = await start_sidecar(f"http://127.0.0.1:{port_of(engine)}")
        yield side.url


async def test_openai(gone: str) -> None:
    async with openai.AsyncOpenAI(base_url=gone + "/v1", api_key="k", max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert caught.value.status_code == 502 and MESSAGE in caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "upstream_error"


async def test_anthropic(gone: str) -> None:
    async with anthropic.AsyncAnthropic(base_url=gone, api_key="k", max_retries=0) as client:
        with pytest.raises(anthropic.InternalServerError) as caught:
            await client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert caught.value.status_code == 502 and MESSAGE in caught.value.message
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "api_error"


async def test_ollama(gone: str) -> None:
    async with ollama.AsyncClient(host=gone) as client:
        with pytest.raises(ollama.ResponseError) as caught:
            await client.chat(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502 and MESSAGE in caught.value.error


async def test_tgi_through_the_hugging_face_client(gone: str) -> None:
    """TGI's ``error_type`` makes the Hugging Face client raise its own error for it."""

    def generate() -> None:
        huggingface_hub.InferenceClient(model=gone).text_generation("hi", max_new_tokens=4)

    with pytest.raises(GenerationError) as caught:
        await asyncio.to_thread(generate)
    assert MESSAGE in str(caught.value)
