"""Workloads: built-in length distributions, the user's JSONL, prompts written to length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmobs.sim.dialects.base import count_prompt_tokens
from llmobs.tools.capacity.workload import (
    Shape,
    WorkloadError,
    builtin,
    chat_body,
    prompt_text,
    workload_of,
)


@pytest.mark.parametrize("tokens", [1, 2, 7, 50, 1000])
def test_a_prompt_is_as_long_as_asked_by_the_sim_s_count(tokens: int) -> None:
    assert count_prompt_tokens(prompt_text(tokens, index=12345)) == tokens
    assert all(len(word) == 3 for word in prompt_text(tokens, 7).split())


def test_no_two_prompts_share_a_prefix_a_cache_could_serve() -> None:
    starts = {prompt_text(64, i).split()[0:2].__repr__() for i in range(24 * 24)}
    assert len(starts) == 24 * 24


def test_fixed_lengths() -> None:
    work = workload_of("fixed:100,64")
    assert work.shape(0) == work.shape(99) == Shape(100, 64)
    assert (work.mean_prompt_tokens, work.mean_output_tokens) == (100, 64)


@pytest.mark.parametrize("spec", ["fixed:100", "fixed:a,b", "fixed:0,5", "chats", "rag:3", "x"])
def test_a_bad_spec_says_what_is_expected(spec: str) -> None:
    with pytest.raises(WorkloadError):
        workload_of(spec)


def test_built_in_distributions_are_seeded_and_in_their_ranges() -> None:
    chat, rag = builtin("chat", seed=1), builtin("rag", seed=1)
    assert chat == builtin("chat", seed=1) != builtin("chat", seed=2)
    assert all(64 <= s.prompt_tokens <= 1024 and 64 <= s.output_tokens <= 512 for s in chat.shapes)
    assert all(1024 <= s.prompt_tokens <= 4096 for s in rag.shapes)
    assert rag.mean_prompt_tokens > 4 * chat.mean_prompt_tokens / 2


def test_a_jsonl_of_lengths_or_prompts(tmp_path: Path) -> None:
    path = tmp_path / "work.jsonl"
    lines = [
        {"prompt_tokens": 10, "output_tokens": 20},
        {"input_length": 30, "output_length": 40},
        {"prompt": "x" * 40, "max_tokens": 8},
        {"text": "abcd"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    work = workload_of(str(path))
    assert work.shapes == (Shape(10, 20), Shape(30, 40), Shape(10, 8, "x" * 40),
                           Shape(1, 128, "abcd"))  # fmt: skip
    assert work.shape(4) == work.shape(0)


@pytest.mark.parametrize(
    "line",
    ['{"prompt_tokens": 10}', "[1, 2]", "not json", '{"prompt_tokens": 0, "output_tokens": 5}'],
)
def test_a_bad_line_is_named(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_tokens": 1, "output_tokens": 1}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:2: "):
        workload_of(str(path))


def test_an_empty_or_missing_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(WorkloadError, match="no request"):
        workload_of(str(tmp_path / "empty.jsonl"))
    with pytest.raises(WorkloadError, match="cannot read"):
        workload_of(str(tmp_path / "absent.jsonl"))


def test_the_request_asks_for_exact_lengths_and_usage() -> None:
    body = chat_body("m", Shape(5, 9), 3)
    assert body["max_tokens"] == 9 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert count_prompt_tokens(body["messages"][0]["content"]) == 5
    assert chat_body("m", Shape(1, 9, "hello"), 3)["messages"][0]["content"] == "hello"
