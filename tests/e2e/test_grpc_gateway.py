"""A real gateway in front of the sidecar's gRPC leg: the Shepherd Model Gateway (``smg``, the
Rust router that speaks vLLM's gRPC API to its engines) serves OpenAI's API to the OpenAI SDK,
tokenizes each request with a tokenizer it loads from the directory the engine names, and
sends the engine one streamed ``Generate`` per request, through the sidecar, to the sim's vLLM
gRPC server.

What the client was told, the sidecar measured: a request each Generate, the completion tokens
of the client's ``usage`` as the sidecar's output tokens, its prompt tokens as the sidecar's
input tokens, the model the engine serves as each request's model (learned from the
GetModelInfo answer the gateway asked for), and the gateway's own calls (HealthCheck,
GetModelInfo, GetServerInfo, GetLoads) relayed as the other methods are.

smg is a test dependency on Linux x86_64 only (its wheel's platform): elsewhere, or where it
is not installed, the module skips, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from llmobs.sim.grpc_engine import start_grpc
from tests.support.ports import free_port
from tests.support.servers import SidecarFactory, SidecarHandle, SimFactory, eventually


def _smg() -> str | None:
    """The venv's ``smg`` (next to this interpreter), else the one on PATH."""
    local = Path(sys.executable).with_name("smg")
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("smg")


SMG = _smg()
_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64"
pytestmark = pytest.mark.skipif(
    not _PLATFORM or SMG is None,
    reason="smg (the Shepherd Model Gateway) is a test dependency on Linux x86_64 only"
    if not _PLATFORM
    else "smg (the Shepherd Model Gateway) is not installed: pip install smg==1.13.0",
)

MODEL = "sim-tiny-chat"
MAX_TOKENS = 16
# Every request's output is exactly its max_tokens: the sim draws a length of 32, and the
# request's limit (16) cuts it, finished as "length".
SCHEDULE: dict[str, Any] = {
    "model": MODEL, "max_batch": 8, "prefill_base": 0.01, "prefill_per_token": 0.0,
    "decode_base": 0.005, "decode_per_seq": 0.0, "output_tokens_min": 2 * MAX_TOKENS,
    "output_tokens_max": 2 * MAX_TOKENS,
}  # fmt: skip
CHATS, AT_ONCE, COMPLETIONS = 8, 4, 2
STARTUP = 20.0  # seconds smg may take to list the model (~0.2 s here)
CALLS = 30.0  # seconds all the client's requests may take (~0.5 s here)

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = (
    "hello world, this is a tiny tokenizer for a gateway in front of the sidecar.",
    "user assistant system the quick brown fox jumps over the lazy dog",
    "Say hi. Hi there! How are you? I am fine, thank you.",
)


def make_tokenizer(directory: Path) -> Path:
    """A small byte-level BPE (as GPT-2's, Qwen's) trained on a fixed corpus, saved as a Hugging
    Face tokenizer directory a gateway loads offline: tokenizer.json, and tokenizer_config.json
    with its chat template and special tokens."""
    directory.mkdir()
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS) * 50, trainer)
    tok.save(str(directory / "tokenizer.json"))
    added = {
        str(tok.token_to_id(text)): {
            "content": text, "special": True, "lstrip": False, "rstrip": False,
            "normalized": False, "single_word": False,
        }
        for text in SPECIAL
    }  # fmt: skip
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": added,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return directory


@contextlib.asynccontextmanager
async def gateway(worker: str, log: Path) -> AsyncIterator[str]:
    """``smg launch`` in front of the gRPC engine at ``worker`` (host:port), until the block
    ends: its OpenAI API's base URL once it lists the model. Its output goes to ``log``,
    printed when the block fails; the process is killed however the block ends."""
    assert SMG is not None
    port, metrics_port = free_port(), free_port()
    argv = [
        SMG, "launch", "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--worker-urls", f"grpc://{worker}", "--worker-startup-check-interval", "1",
        "--health-check-interval-secs", "5", "--load-monitor-interval", "3",
    ]  # fmt: skip
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1",
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
    }  # fmt: skip
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
        )
    base = f"http://127.0.0.1:{port}"
    try:
        await _until_serving(proc, base)
        yield base + "/v1"
    except BaseException:
        _show(argv, log)
        raise
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def _show(argv: list[str], log: Path) -> None:
    """What smg was told and wrote (pytest shows it with the failure)."""
    print(f"--- smg ({' '.join(argv)}):\n{log.read_text(errors='replace')}")


async def _until_serving(proc: asyncio.subprocess.Process, base: str) -> None:
    """Wait until smg lists the model (its worker registered) and its tokenizer (loaded in
    the background once the worker's GetModelInfo named it: until then a request is a 503)."""
    async with asyncio.timeout(STARTUP), aiohttp.ClientSession() as session:
        while True:
            assert proc.returncode is None, f"smg exited ({proc.returncode})"
            models = await _listed(session, base + "/v1/models", "data", "id")
            tokenizers = await _listed(session, base + "/v1/tokenizers", "tokenizers", "name")
            if MODEL in models and MODEL in tokenizers:
                return
            await asyncio.sleep(0.05)


async def _listed(session: aiohttp.ClientSession, url: str, key: str, field: str) -> set[str]:
    """The ``field`` of each item a JSON list at ``url`` holds under ``key`` (none yet: {})."""
    with contextlib.suppress(aiohttp.ClientError):
        async with session.get(url) as response:
            if response.status == 200:
                listed = await response.json()
                return {str(item.get(field)) for item in listed.get(key) or ()}
    return set()


def _counts(side: SidecarHandle) -> str:
    """The sidecar's request and token counts, one sample a line."""
    names = ("llmobs_requests_total", "llmobs_api_requests_total", "llmobs_tokens_total")
    return "\n".join(
        f"{sample.name}{sample.labels} {sample.value}"
        for family in side.registry.collect()
        for sample in family.samples
        if sample.name in names
    )


def _labels(side: SidecarHandle, name: str, label: str, **labels: str) -> set[str]:
    """The values ``label`` takes on the samples named ``name`` that carry ``labels``."""
    return {
        sample.labels[label]
        for family in side.registry.collect()
        for sample in family.samples
        if sample.name == name
        and label in sample.labels
        and all(sample.labels.get(k) == v for k, v in labels.items())
    }


async def test_what_a_gateway_client_was_told_the_sidecar_measured(
    start_sim: SimFactory, start_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    sim = await start_sim(**SCHEDULE, tokenizer_path=str(tokenizer))
    # vLLM's API alone, as a vLLM engine serves it: smg asks every API's HealthCheck at once
    # and takes SGLang's where that answers too
    server, port = await start_grpc(sim.engine, "127.0.0.1", 0, apis=("vllm",))
    try:
        side = await start_sidecar(f"http://127.0.0.1:{port}")
        worker = side.url.removeprefix("http://")
        async with (
            gateway(worker, tmp_path / "smg.log") as base_url,
            DefaultAsyncHttpxClient(trust_env=False) as http,  # loopback: no proxy from the env
        ):
            client = AsyncOpenAI(
                base_url=base_url, api_key="x", http_client=http, max_retries=0, timeout=CALLS
            )
            async with asyncio.timeout(CALLS):
                usages = await _drive(client)
            try:
                # the gateway tokenized each prompt with the tokenizer the sim named
                words = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
                assert [prompt for prompt, _ in usages] == [
                    len(words.encode(text).ids) for text in _prompts()
                ]
                await _measured(side, usages)
            except AssertionError:
                print(f"--- the client's usages (prompt, completion): {usages}")
                print(f"--- the sidecar's counts:\n{_counts(side)}")
                raise
    finally:
        await server.stop(None)


def _chat(i: int) -> str:
    return f"Say hi to the lazy dog number {i}."


def _completion(i: int) -> str:
    return f"hello world {i}, the quick brown fox"


def _prompts() -> list[str]:
    """What the engine is sent for each request ``_drive`` makes, in its order: the chats'
    message rendered by the chat template, the completions' prompt as it is."""
    chats = [
        f"<|im_start|>user\n{_chat(i)}<|im_end|>\n<|im_start|>assistant\n" for i in range(CHATS)
    ]
    return chats + [_completion(i) for i in range(COMPLETIONS)]


async def _drive(client: AsyncOpenAI) -> list[tuple[int, int]]:
    """8 streamed chats (4 at a time) and 2 completions not streamed: each one's usage
    (prompt tokens, completion tokens), as the gateway reported it."""
    gate = asyncio.Semaphore(AT_ONCE)

    async def chat(i: int) -> tuple[int, int]:
        async with gate:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": _chat(i)}],
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            )
            usage, finish = None, None
            async for chunk in stream:
                usage = chunk.usage or usage
                finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
        assert usage is not None and finish == "length", (usage, finish)
        return usage.prompt_tokens, usage.completion_tokens

    async def completion(i: int) -> tuple[int, int]:
        answer = await client.completions.create(
            model=MODEL, prompt=_completion(i), max_tokens=MAX_TOKENS
        )
        assert answer.usage is not None and answer.choices[0].finish_reason == "length"
        return answer.usage.prompt_tokens, answer.usage.completion_tokens

    return list(
        await asyncio.gather(
            *(chat(i) for i in range(CHATS)), *(completion(i) for i in range(COMPLETIONS))
        )
    )


async def _measured(side: SidecarHandle, usages: list[tuple[int, int]]) -> None:
    calls = CHATS + COMPLETIONS
    assert [completion for _, completion in usages] == [MAX_TOKENS] * calls
    # every request the client made is one Generate the sidecar measured (each as it ended)
    await eventually(lambda: side.value("llmobs_api_requests_total", api="vllm-grpc") == calls)
    operation = {"gen_ai_operation_name": "text_completion"}
    await eventually(lambda: side.value("llmobs_requests_total", **operation) == calls)
    assert side.value("llmobs_requests_total", outcome="ok", finish_reason="length",
                      **operation) == calls  # fmt: skip
    assert side.value("llmobs_api_requests_total", api="vllm-grpc", transport="grpc",
                      rpc_grpc_status_code="0") == calls  # fmt: skip
    # the tokens the client was told of, as the sidecar counted them
    assert side.value("llmobs_tokens_total", gen_ai_token_type="output") == sum(
        completion for _, completion in usages
    )
    assert side.value("llmobs_tokens_total", gen_ai_token_type="input") == sum(
        prompt for prompt, _ in usages
    )
    # the gateway's own calls (HealthCheck, GetModelInfo, GetServerInfo, GetLoads) relayed
    assert side.value("llmobs_api_requests_total", api="grpc", transport="grpc") > 0
    # each request's model: the one the engine's GetModelInfo answer named to the gateway
    models = _labels(side, "llmobs_requests_total", "gen_ai_request_model", **operation)
    assert models == {MODEL}
