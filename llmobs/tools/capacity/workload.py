"""Request shapes to load an engine with: built-in length distributions or the user's JSONL.

A shape is a prompt length and an output length, in tokens. The prompt is written in
three-letter words (each one token to common BPE vocabularies, and four characters: the
sim's rule of thumb, so both count it as asked), led by the request's own number so that
no two prompts share a prefix a cache could serve. The output length is enforced with
``ignore_eos`` (vLLM's and llama.cpp's switch, the sim's too), as benchmark clients do, so
that every level of a search does the same work per request.

A JSONL line is either lengths, ``{"prompt_tokens": P, "output_tokens": O}`` (guidellm's
names; aiperf's trace ``input_length``/``output_length`` too), or a prompt,
``{"prompt": "...", "max_tokens": O}`` (``text`` and ``output_tokens`` also read).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_WORDS = (
    "the", "fox", "dog", "cat", "sun", "sea", "sky", "map", "key", "box", "red", "big",
    "old", "new", "day", "way", "man", "car", "bus", "cup", "pen", "hat", "arm", "leg",
)  # fmt: skip
BUILTIN = ("fixed", "chat", "rag")
_DEFAULT_OUTPUT = 128  # a prompt line without an output length


class WorkloadError(ValueError):
    """A workload that cannot be read: the message says which and where."""


@dataclass(frozen=True, slots=True)
class Shape:
    """One request's lengths (tokens); ``prompt``: the user's text, else written to length."""

    prompt_tokens: int
    output_tokens: int
    prompt: str | None = None


@dataclass(frozen=True)
class Workload:
    """The shapes, taken in turn (a seeded draw for the built-in distributions)."""

    name: str
    shapes: tuple[Shape, ...]

    def shape(self, index: int) -> Shape:
        return self.shapes[index % len(self.shapes)]

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(s.prompt_tokens for s in self.shapes) / len(self.shapes)

    @property
    def mean_output_tokens(self) -> float:
        return sum(s.output_tokens for s in self.shapes) / len(self.shapes)


def prompt_text(tokens: int, index: int) -> str:
    """``tokens`` three-letter words, the first five spelling ``index`` (least significant
    first: two requests' prompts differ within their first words, so no cache serves one
    from the other)."""
    lead: list[str] = []
    n = index
    for _ in range(5):
        n, digit = divmod(n, len(_WORDS))
        lead.append(_WORDS[digit])
    words = [*lead, *(_WORDS[(index + i) % len(_WORDS)] for i in range(tokens))]
    return " ".join(words[:tokens])


def _uniform(rng: random.Random, low: int, high: int, count: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(count)]


def builtin(spec: str, seed: int = 0, count: int = 512) -> Workload:
    """``fixed:P,O`` (every request P prompt and O output tokens), ``chat`` (prompts of
    64-1024 tokens, outputs of 64-512) or ``rag`` (prompts of 1024-4096, outputs of 64-256),
    the last two a seeded uniform draw of ``count`` shapes."""
    kind, _, arg = spec.partition(":")
    if kind == "fixed":
        try:
            p, o = (int(part) for part in arg.split(","))
        except ValueError:
            raise WorkloadError(
                f"fixed:PROMPT,OUTPUT (tokens, e.g. fixed:256,128): {spec!r}"
            ) from None
        if p < 1 or o < 1:
            raise WorkloadError(f"fixed: lengths must be at least 1 token: {spec!r}")
        return Workload(spec, (Shape(p, o),))
    ranges = {"chat": ((64, 1024), (64, 512)), "rag": ((1024, 4096), (64, 256))}
    if kind not in ranges or arg:
        raise WorkloadError(f"unknown workload {spec!r}: fixed:P,O, chat, rag, or a JSONL file")
    rng = random.Random(f"{kind}:{seed}")
    (p_lo, p_hi), (o_lo, o_hi) = ranges[kind]
    shapes = zip(_uniform(rng, p_lo, p_hi, count), _uniform(rng, o_lo, o_hi, count), strict=True)
    return Workload(kind, tuple(Shape(p, o) for p, o in shapes))


def _length(line: dict[str, Any], names: Sequence[str]) -> int | None:
    for name in names:
        value = line.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def shape_of(line: Any) -> Shape:
    """One JSONL line's shape; ``WorkloadError`` saying what a line may hold."""
    if not isinstance(line, dict):
        raise WorkloadError("a line must be a JSON object")
    output = _length(line, ("output_tokens", "output_length", "max_tokens"))
    text = line.get("prompt", line.get("text"))
    if isinstance(text, str) and text:
        return Shape(max(1, math.ceil(len(text) / 4)), output or _DEFAULT_OUTPUT, text)
    prompt = _length(line, ("prompt_tokens", "input_length"))
    if prompt is None or output is None:
        raise WorkloadError(
            'a line must give {"prompt_tokens": P, "output_tokens": O} or {"prompt": "...", '
            '"max_tokens": O}'
        )
    return Shape(prompt, output)


def from_jsonl(path: Path) -> Workload:
    """The shapes of a JSONL file, in its order; ``WorkloadError`` naming the bad line."""
    shapes: list[Shape] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from None
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            shapes.append(shape_of(json.loads(text)))
        except (ValueError, WorkloadError) as exc:
            raise WorkloadError(f"{path}:{number}: {exc}") from None
    if not shapes:
        raise WorkloadError(f"{path}: no request in it")
    return Workload(path.name, tuple(shapes))


def workload_of(spec: str, seed: int = 0) -> Workload:
    """A built-in distribution by name, or a JSONL file by path (one with a ``/`` or
    ending in ``.jsonl``)."""
    if spec.endswith(".jsonl") or "/" in spec:
        return from_jsonl(Path(spec))
    return builtin(spec, seed)


def chat_body(model: str, shape: Shape, index: int) -> dict[str, Any]:
    """The streaming chat request of ``shape`` (usage asked for: the engine's counts)."""
    text = shape.prompt if shape.prompt is not None else prompt_text(shape.prompt_tokens, index)
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": shape.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
