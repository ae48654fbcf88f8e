"""What a request body says that telemetry may use: the model, the stream flag, the sampling
settings; the prompt only when content capture is on. Pure: bytes in, a record out, never
raises. Format knowledge (OpenAI, Anthropic, Ollama, TGI bodies), hence here in ``formats``.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from llmobs.observe.dialects import OTHER_ROUTE, Route
from llmobs.observe.dialects.base import MAX_MODEL_LENGTH, loads
from llmobs.observe.dialects.grpc import GrpcDialect, ServedModel
from llmobs.observe.disagg import Claim, claim_of

CONTENT_LIMIT = 1024  # characters of prompt / completion kept with --capture-content


def truncate(text: str) -> str:
    """Captured content as it may go on a span: at most ``CONTENT_LIMIT`` characters."""
    return text if len(text) <= CONTENT_LIMIT else text[:CONTENT_LIMIT] + "…"


class RequestInfo(NamedTuple):
    """What the request body says that telemetry may use (no prompt text). A named tuple
    (docs/architecture.md, "Records are named tuples")."""

    model: str | None = None
    stream: bool = False
    include_usage: bool = False  # an OpenAI stream that already asked for usage
    max_tokens: int | None = None
    temperature: float | None = None
    prompt: str | None = None  # only with --capture-content, truncated
    claim: Claim = Claim.NONE  # the P/D role its ``kv_transfer_params`` claim (``disagg``)


_PARSE_LIMIT = 1 << 20
_NO_CLAIM = Claim.NONE  # (an enum member read off its class costs a metaclass lookup)
_SCAN = 64 * 1024
_MODEL_RE = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){1,%d})"' % MAX_MODEL_LENGTH)
_STREAM_RE = re.compile(rb'"stream"\s*:\s*(true|false)\b')
_PREFILL_LEG_RE = re.compile(rb'"do_remote_decode"\s*:\s*true\b')
_DECODE_LEG_RE = re.compile(rb'"do_remote_prefill"\s*:\s*true\b')


def parse_request(body: bytes, route: Route = OTHER_ROUTE, capture: bool = False) -> RequestInfo:
    """Pick the model, stream flag and sampling settings out of a JSON request body.

    Tolerates anything. Bodies up to 1 MiB are parsed (orjson when present: fast).
    Larger ones (long prompts, images) are only scanned at both ends, where clients put these
    keys, so that a 16 MiB prompt does not hold up every other stream on the event loop.
    The prompt itself is read only with ``capture`` (``--capture-content``).
    """
    if len(body) > _PARSE_LIMIT:
        ends = body[:_SCAN] + b"\n" + body[-_SCAN:]
        found = _MODEL_RE.search(ends)
        model = found.group(1).decode("utf-8", "replace") if found else route.model
        stream = _STREAM_RE.search(ends)
        flag = stream.group(1) == b"true" if stream else None
        return RequestInfo(model, route.streams(flag), claim=_scanned_claim(ends))
    try:
        obj: Any = loads(body)
    except ValueError:
        return _no_body(route)
    if not isinstance(obj, dict):
        return _no_body(route)
    get = obj.get
    model = get("model")
    options = get("stream_options")
    include = isinstance(options, dict) and options.get("include_usage") is True
    nested = get("options") or get("parameters")  # Ollama options, TGI's and Triton's parameters
    nested = nested if isinstance(nested, dict) else {}
    max_tokens = _first_int(
        get("max_tokens"), get("max_completion_tokens"), get("max_output_tokens"),
        nested.get("num_predict"), nested.get("max_new_tokens"), nested.get("max_tokens"),
    )  # fmt: skip
    temperature = get("temperature", nested.get("temperature"))
    params = get("kv_transfer_params")  # (no call for the usual body, which has none)
    claim = _NO_CLAIM if params is None else claim_of(params)
    prompt = None
    if capture:
        text = next((obj[k] for k in _PROMPT_KEYS if k in obj), None)
        prompt = truncate(text if isinstance(text, str) else json_text(text))
    return RequestInfo(
        model[:MAX_MODEL_LENGTH] if isinstance(model, str) else route.model,
        route.streams(get("stream")),
        include,
        max_tokens,
        float(temperature) if isinstance(temperature, int | float) else None,
        prompt,
        claim,
    )


def parse_grpc_request(body: bytes, route: Route, served: ServedModel | None = None) -> RequestInfo:
    """What a gRPC request's first message says (its stream flag, max tokens, Triton's
    model; else the model ``served`` learned); a compressed, cut or broken one says nothing.
    Never raises."""
    dialect = route.dialect
    if len(body) < 5 or body[0] or not issubclass(dialect, GrpcDialect):
        return _no_body(route)
    message = body[5 : 5 + int.from_bytes(body[1:5], "big")]
    try:
        stream, limit, model = dialect.read_request(message)
    except Exception:  # a malformed message: google.protobuf's DecodeError, and the like
        return _no_body(route)
    if model is None and served is not None:
        model = served.name
    return RequestInfo(model or route.model, route.streams(stream), max_tokens=limit)


def _scanned_claim(ends: bytes) -> Claim:
    """The P/D role a body too large to parse claims, as its scanned ends show it: a proxy
    writes the parameters first or last (Go's encoder sorts the keys, so they come before
    ``messages``). Only the flag is looked for: a long prompt's block ids may push the
    engine's id past the scanned end."""
    if _PREFILL_LEG_RE.search(ends):
        return Claim.PREFILL
    if _DECODE_LEG_RE.search(ends):
        return Claim.DECODE
    return Claim.NONE


_PROMPT_KEYS = ("messages", "prompt", "input", "inputs")
# What is known of a request before its body is read, by whether its path always streams
# (made once and shared: immutable, and one fewer record made per request).
NO_BODY = (RequestInfo(stream=False), RequestInfo(stream=True))


def _no_body(route: Route) -> RequestInfo:
    """What a request says whose body is not a JSON object: its path's model, if any."""
    if route.model is None:
        return NO_BODY[route.always_streams]
    return RequestInfo(route.model, route.always_streams)


def _first_int(*values: Any) -> int | None:
    """The first int (not bool) among ``values``: a loop, cheaper than a generator here."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)[: CONTENT_LIMIT + 1]
    except (TypeError, ValueError):
        return ""
