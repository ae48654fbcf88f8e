"""Dialect: OpenAI-compatible Chat Completions and (legacy) Completions streams.

vLLM, SGLang, TGI's Messages API, llama.cpp, Ollama's /v1 and most gateways speak it.

What counts as output: generated text in ``delta.content``, ``delta.reasoning_content`` /
``delta.reasoning`` (reasoning: counted and labelled as such), ``delta.refusal``, tool-call
argument deltas, or a completions ``text``. Role-only, empty and finish-only chunks are not
output; ``logprobs`` ride along and change nothing. Choices (``n > 1``) are accounted
separately by their ``index``.

Tokens per chunk: when the engine reports cumulative usage on every chunk (vLLM's
``continuous_usage_stats``) the delta of ``completion_tokens`` is exact; otherwise a chunk
counts as one token and the final ``usage`` (``include_usage``, the ``choices: []`` chunk)
lets the timer spread the true total afterwards. Usage on a single chunk that also has choices
proves nothing (llama.cpp and TGI put the final total there): only from the second such chunk
on is usage taken as continuous. llama.cpp's final chunk also carries its ``timings``: the
prompt's prefill time is kept as the engine's own; so are vLLM's per-request ``metrics``
(``--enable-per-request-metrics``: the request's queue and prefill times).

Fast path (``Template``): within one response, the plain token events (one choice, text in
``content``, no usage, no finish reason) differ only in the text: id, model, created and every
other field repeat byte for byte. Once such an event has been parsed, its bytes around the
content string are kept; a later event made of the same bytes around another valid, non-empty
JSON string must parse to the same object but for that one string, so it counts one token for
the same choice without being parsed (a fraction of a parse's cost). Anything else is parsed.
``WholeEvent`` goes one step further for the observer: a read that is such an event, framed,
is counted without the SSE decoder either. ``tests/unit/observe/dialects/test_openai.py`` and
``tests/unit/observe/test_reader.py`` check the fast paths against the full ones on generated
events.
"""

from __future__ import annotations

import re
from typing import Any

from llmobs.observe.dialects.base import Dialect, as_int, loads
from llmobs.observe.framing import SseDecoder

DONE = b"[DONE]"
# The one place an event's content string starts (its key, raw: no escapes in it).
_CONTENT = re.compile(rb'"content"[ \t\n\r]*:[ \t\n\r]*"')
# A JSON string body: no raw quote, backslash or control character ...
_UNSAFE = re.compile(rb'["\\\x00-\x1f]')
# ... or, when it has escapes, valid ones (no lone surrogate: orjson rejects them).
_BODY = re.compile(rb'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u(?![dD][89a-fA-F])[0-9a-fA-F]{4}))+')
# Printable ASCII but quote and backslash: a body of only these bytes is a valid JSON string
# with no escapes (the template fast path's first test). Tested as ``not body.lstrip(PLAIN)``:
# lstrip is a memchr per byte, and an empty result is a shared object, nothing allocated;
# ``re`` is slower, the more so in the relay, where each read finds the caches cold (its engine
# is a large body of code; docs/benchmarks.md).
PLAIN = bytes(range(0x20, 0x22)) + bytes(range(0x23, 0x5C)) + bytes(range(0x5D, 0x80))

__all__ = ["DONE", "PLAIN", "OpenAIStream", "Template", "WholeEvent", "loads"]


def _text_kind(delta: dict[str, Any]) -> int:
    """0: no output; 1: visible output (content, refusal, tool arguments); 2: reasoning."""
    if delta.get("content") or delta.get("refusal"):
        return 1
    if delta.get("reasoning_content") or delta.get("reasoning"):
        return 2
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                fn = call.get("function")
                if isinstance(fn, dict) and fn.get("arguments"):
                    return 1
    return 0


def _plain_choice(obj: dict[str, Any]) -> int | None:
    """The choice a plain token event counts for: one choice, text in ``content``, no finish
    reason, no usage, no error; None for any other event (it cannot be a template)."""
    if "error" in obj or isinstance(obj.get("usage"), dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    item = choices[0]
    delta = item.get("delta") or item.get("message")
    if not isinstance(delta, dict) or not isinstance(delta.get("content"), str):
        return None
    if not delta["content"] or item.get("finish_reason"):
        return None
    index = item.get("index")
    return index if isinstance(index, int) and 0 <= index < 64 else 0


def _text_of(delta: dict[str, Any]) -> str:
    parts = [delta.get(k) for k in ("reasoning_content", "reasoning", "content", "refusal")]
    return "".join(p for p in parts if isinstance(p, str))


def json_string_body(body: bytes) -> bool:
    """Whether ``"`` + ``body`` + ``"`` is a valid, non-empty JSON string (as orjson reads it)."""
    if not body:
        return False
    if _UNSAFE.search(body) is not None and _BODY.fullmatch(body) is None:
        return False
    if not body.isascii():
        try:
            body.decode("utf-8")  # strict: rejects what orjson rejects (surrogates, overlongs)
        except UnicodeDecodeError:
            return False
    return True


class Template:
    """The bytes of a plain token event around its content string, and the choice it counts."""

    __slots__ = ("choice", "head", "size", "start", "tail", "tail_size")

    def __init__(self, head: bytes, tail: bytes, choice: int) -> None:
        self.head = head
        self.tail = tail
        self.start = len(head)
        self.tail_size = len(tail)
        self.size = len(head) + len(tail)
        self.choice = choice

    @classmethod
    def of(cls, data: bytes, choice: int) -> Template | None:
        """The template of ``data``, a parsed plain token event; None if its content string
        cannot be told apart (its key appears more than once, or not raw)."""
        found = _CONTENT.search(data)
        if found is None or _CONTENT.search(data, found.end()) is not None:
            return None
        start = found.end()
        end = _BODY.match(data, start)
        if end is None or data[end.end() : end.end() + 1] != b'"':
            return None
        return cls(data[:start], data[end.end() :], choice)

    def matches(self, data: bytes) -> bool:
        """``data`` is this template around a valid non-empty JSON string."""
        head, tail = self.head, self.tail
        if len(data) <= self.size or not data.startswith(head) or not data.endswith(tail):
            return False
        return json_string_body(data[len(head) : len(data) - len(tail)])


class OpenAIStream(Dialect):
    """State of one OpenAI-dialect response."""

    __slots__ = ("_cumulative", "_usage_chunks", "fast", "template")

    def __init__(self) -> None:
        super().__init__()
        self._cumulative = 0  # completion tokens already attributed to chunks
        self._usage_chunks = 0  # chunks seen with both choices and usage
        # the latest plain token event's template (read by the observer's whole-read path)
        self.template: Template | None = None
        self.fast = True  # the template fast path (tests turn it off to compare)

    def on_data(self, data: bytes) -> int:
        template = self.template
        if (
            template is not None
            and len(data) > template.size
            and data.startswith(template.head)
            and data.endswith(template.tail)
        ):
            body = data[template.start : len(data) - template.tail_size]
            # printable ASCII but quote and backslash, else the full check
            if not body.lstrip(PLAIN) or json_string_body(body):
                return self.output(1, template.choice) if template.choice else 1
        if data == DONE:
            self.done = True
            return 0
        try:
            obj = loads(data)
        except ValueError:
            self.malformed += 1
            return 0
        if not isinstance(obj, dict):
            self.malformed += 1
            return 0
        tokens = self.on_object(obj)
        if tokens == 1 and self.fast and self.captured is None and self.response_id is not None:
            choice = _plain_choice(obj)
            if choice is not None:
                self.template = Template.of(data, choice)
        return tokens

    def on_object(self, obj: dict[str, Any]) -> int:
        if self.response_id is None:
            self._identify(obj)
        if "error" in obj:
            self.error = True
        metrics = obj.get("metrics")
        if isinstance(metrics, dict):
            self._metrics(metrics)
        choices = obj.get("choices")
        outputs = self._outputs(choices) if isinstance(choices, list) else ()
        usage = obj.get("usage")
        if isinstance(usage, dict):
            choice, kind = outputs[0] if outputs else (0, 0)
            tokens = self._usage(usage, bool(choices), kind != 0)
            if tokens is not None:
                return self.output(tokens, choice, kind == 2)
        if not outputs:  # llama.cpp's final chunk (the finish or the usage one)
            timings = obj.get("timings")
            if isinstance(timings, dict):
                self._timings(timings)
        tokens = 0
        for choice, kind in outputs:  # more than one: a gateway that merges choices' chunks
            tokens += self.output(1, choice, kind == 2)
        return tokens

    def _identify(self, obj: dict[str, Any]) -> None:
        rid = obj.get("id")
        if isinstance(rid, str):
            self.response_id = rid
        model = obj.get("model")
        if isinstance(model, str):
            self.response_model = model

    def _timings(self, timings: dict[str, Any]) -> None:
        """llama.cpp's ``timings``: ``prompt_ms`` is the prefill of the prompt tokens not in
        its cache, the engine's own share of TTFT (as Ollama's ``prompt_eval_duration``)."""
        prompt_ms = timings.get("prompt_ms")
        if isinstance(prompt_ms, int | float) and not isinstance(prompt_ms, bool):
            self.engine_prompt_eval_s = max(prompt_ms, 0) / 1000

    def _metrics(self, metrics: dict[str, Any]) -> None:
        """vLLM's per-request ``metrics`` (``--enable-per-request-metrics``): ``queue_time_ms``
        the request waited to be scheduled, ``time_to_first_token_ms`` from its scheduling to
        its first token (its prefill, as the engine counts it)."""
        queue = metrics.get("queue_time_ms")
        if isinstance(queue, int | float) and not isinstance(queue, bool):
            self.engine_queue_s = max(queue, 0) / 1000
        prefill = metrics.get("time_to_first_token_ms")
        if isinstance(prefill, int | float) and not isinstance(prefill, bool):
            self.engine_prompt_eval_s = max(prefill, 0) / 1000

    def _outputs(self, choices: list[Any]) -> list[tuple[int, int]]:
        """(choice index, kind: 1 text, 2 reasoning) of each choice with output in this chunk,
        its text captured (``--capture-content``) and its finish reason noted."""
        out: list[tuple[int, int]] = []
        for item in choices:
            if not isinstance(item, dict):
                continue
            delta = item.get("delta") or item.get("message")
            found = _text_kind(delta) if isinstance(delta, dict) else (1 if item.get("text") else 0)
            if found:
                if self.captured is not None:
                    self.keep(_text_of(delta) if isinstance(delta, dict) else item.get("text"))
                index = item.get("index")
                out.append((index if isinstance(index, int) and 0 <= index < 64 else 0, found))
            reason = item.get("finish_reason")
            if reason:
                self.finish(reason)
        return out

    def _usage(self, usage: dict[str, Any], has_choices: bool, output: bool) -> int | None:
        """Record usage; for a chunk with choices and continuous usage, its exact tokens."""
        prompt = as_int(usage.get("prompt_tokens"))
        completion = as_int(usage.get("completion_tokens"))
        if prompt is not None:
            self.input_tokens = prompt
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and as_int(details.get("cached_tokens")) is not None:
            self.cached_tokens = details["cached_tokens"]
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict) and as_int(details.get("reasoning_tokens")) is not None:
            self.reasoning_tokens = details["reasoning_tokens"]
        if completion is None:
            return None
        self.output_tokens = completion
        if not has_choices:
            return None
        self._usage_chunks += 1
        if self._usage_chunks == 1:
            if output:
                self._cumulative = completion
            return None
        self.per_chunk_usage = True
        if not output:
            return 0  # an EOS or role chunk: its tokens are carried to the next text chunk
        tokens = completion - self._cumulative
        self._cumulative = completion
        return max(tokens, 1)


class WholeEvent:
    """A read that is exactly one plain token event of choice 0 in SSE framing: ``data: ``,
    the template's head, a content string, the template's tail, a blank line.

    Arriving while the decoder has nothing pending, such a read is one event, whose payload
    the dialect counts as one token without parsing it (``Template``), and neither the
    decoder's state nor the dialect's changes: so the observer counts it without calling
    either, which is most of a read's cost (``Observer.chunk``). The content must be plain
    (``PLAIN``: printable ASCII but quote and backslash), which also keeps CR and LF out of
    it; a template whose head or tail has one is not used.
    ``tests/unit/observe/test_reader.py`` holds readers with and without this path to the same
    records.
    """

    __slots__ = ("decoder", "head", "limit", "size", "start", "tail", "tail_size")

    def __init__(self, template: Template, decoder: SseDecoder, max_line: int) -> None:
        self.decoder = decoder
        self.head = b"data: " + template.head
        self.tail = template.tail + b"\n\n"
        self.start = len(self.head)
        self.tail_size = len(self.tail)
        self.size = self.start + self.tail_size
        self.limit = max_line + 2  # the decoder's line limit, with the blank line

    def count(self, data: bytes) -> int:
        """How many such events ``data`` is, back to back and nothing else (0: not only
        those): a busy engine's reads coalesce, several token events to a read. The content
        is plain, so its closing quote is the first after the head, where the tail starts."""
        head, tail, start, tail_size = self.head, self.tail, self.start, self.tail_size
        limit = self.limit
        pos, size, count = 0, len(data), 0
        while pos < size:
            if not data.startswith(head, pos):
                return 0
            first = pos + start
            quote = data.find(b'"', first)
            if (
                quote <= first
                or quote + tail_size - pos > limit
                or not data.startswith(tail, quote)
                or data[first:quote].lstrip(PLAIN)
            ):
                return 0
            pos = quote + tail_size
            count += 1
        return count

    @classmethod
    def of(cls, template: Template | None, decoder: SseDecoder, max_line: int) -> WholeEvent | None:
        """For the dialect's current template, read by ``decoder``; None where none applies."""
        if template is None or template.choice:
            return None
        around = template.head + template.tail
        if 10 in around or 13 in around:  # LF or CR: would be framed as other lines
            return None
        return cls(template, decoder, max_line)
