"""Stream formats: framing (bytes -> events) and dialects (events -> tokens), all pure.

``route_for_path`` picks the dialect from the request path and ``detect_stream`` the framing
from the response's Content-Type, so no configuration is needed. Paths match by suffix, so
gateways' prefixes (``/openai/v1/chat/completions``) work too. Triton's generate paths name
the model (``/v2/models/{model}/generate_stream``): their route carries it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from llmobs.observe.dialects.anthropic import AnthropicStream
from llmobs.observe.dialects.base import MAX_MODEL_LENGTH, Dialect, Passthrough
from llmobs.observe.dialects.grpc import (
    GenerateStream,
    ModelInfoReply,
    SglangModelInfo,
    SglangStream,
    TritonGrpcStream,
    TritonInfer,
    TrtllmModelInfo,
    TrtllmStream,
)
from llmobs.observe.dialects.ollama import OllamaStream
from llmobs.observe.dialects.openai import OpenAIStream
from llmobs.observe.dialects.responses import ResponsesStream
from llmobs.observe.dialects.tgi import TgiStream
from llmobs.observe.dialects.triton import TritonStream
from llmobs.observe.labels import OTHER

CHAT = "chat"
TEXT_COMPLETION = "text_completion"
OPERATIONS = (CHAT, TEXT_COMPLETION, OTHER)  # the operation label's values: a closed set


@dataclass(frozen=True, slots=True)
class Route:
    """How a request path is measured: its GenAI operation and its response dialect."""

    operation: str
    dialect: type[Dialect]
    name: str
    stream_default: bool = False  # streaming when the body has no "stream" (Ollama: yes)
    always_streams: bool = False  # the path itself streams (TGI /generate_stream)
    # what the request body must hold for the route to be this one (None: the path says it
    # all); a body without it is measured as an unknown route
    confirm: bytes | None = None
    model: str | None = None  # the model the path names (Triton), for a body without one
    grpc: bool = False  # a gRPC method's: its body is length-prefixed protobuf, not JSON

    def __str__(self) -> str:
        """How a request is named in a log line: its operation and dialect (closed sets)."""
        return f"{self.operation}/{self.name}"

    def streams(self, flag: object) -> bool:
        """Whether a request with body field ``stream`` = ``flag`` gets a stream back."""
        if self.always_streams:
            return True
        return flag is True or (flag is None and self.stream_default)


OPENAI_CHAT = Route(CHAT, OpenAIStream, "openai")
OPENAI_COMPLETIONS = Route(TEXT_COMPLETION, OpenAIStream, "openai")
RESPONSES = Route(CHAT, ResponsesStream, "openai-responses")
ANTHROPIC = Route(CHAT, AnthropicStream, "anthropic")
TGI_STREAM = Route(TEXT_COMPLETION, TgiStream, "tgi", always_streams=True)
TGI = Route(TEXT_COMPLETION, TgiStream, "tgi")
OLLAMA_GENERATE = Route(TEXT_COMPLETION, OllamaStream, "ollama", stream_default=True)
OLLAMA_CHAT = Route(CHAT, OllamaStream, "ollama", stream_default=True)
# a path of no API measured: relayed and timed, its operation other
OTHER_ROUTE = Route(OTHER, Passthrough, "none")
# TGI's compat route: POST / is /generate_stream when the body says "stream": true, else
# /generate (router/src/server.rs, compat_generate), which Hugging Face's InferenceClient
# posts to when given the server's URL; a body without "inputs" is not TGI's
TGI_COMPAT = Route(TEXT_COMPLETION, TgiStream, "tgi", confirm=b'"inputs"')
# Triton's generate extension (TensorRT-LLM): the path names the model, and the stream's path
# answers in SSE whatever the body says
TRITON_STREAM = Route(TEXT_COMPLETION, TritonStream, "triton", always_streams=True)
TRITON = Route(TEXT_COMPLETION, TritonStream, "triton")
_TRITON_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/[0-9]+)?/(generate(?:_stream)?)$")

# gRPC methods (the path is /package.Service/Method): the engines' token streams, whose
# request says whether it streams (Triton's stream always does)
VLLM_GRPC = Route(TEXT_COMPLETION, GenerateStream, "vllm-grpc", grpc=True)
SGLANG_GRPC = Route(TEXT_COMPLETION, SglangStream, "sglang-grpc", grpc=True)
TRTLLM_GRPC = Route(TEXT_COMPLETION, TrtllmStream, "trtllm-grpc", grpc=True)
TRITON_GRPC_STREAM = Route(
    TEXT_COMPLETION, TritonGrpcStream, "triton-grpc", always_streams=True, grpc=True
)
TRITON_GRPC = Route(TEXT_COMPLETION, TritonInfer, "triton-grpc", grpc=True)
# the engines' model info: the served model, learned for their Generate requests (no model)
VLLM_MODEL_INFO = Route(OTHER, ModelInfoReply, "grpc", grpc=True)
SGLANG_MODEL_INFO = Route(OTHER, SglangModelInfo, "grpc", grpc=True)
TRTLLM_MODEL_INFO = Route(OTHER, TrtllmModelInfo, "grpc", grpc=True)
# any other gRPC method (health, aborts, loads: a gRPC request's content type says so): relayed
# and timed, its API ``grpc``
OTHER_GRPC = Route(OTHER, Passthrough, "grpc", grpc=True)
GRPC_METHODS = {
    "/vllm.grpc.engine.VllmEngine/GetModelInfo": VLLM_MODEL_INFO,
    "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo": SGLANG_MODEL_INFO,
    "/trtllm.TrtllmService/GetModelInfo": TRTLLM_MODEL_INFO,
    "/vllm.grpc.engine.VllmEngine/Generate": VLLM_GRPC,
    "/sglang.grpc.scheduler.SglangScheduler/Generate": SGLANG_GRPC,
    "/trtllm.TrtllmService/Generate": TRTLLM_GRPC,
    "/inference.GRPCInferenceService/ModelStreamInfer": TRITON_GRPC_STREAM,
    "/inference.GRPCInferenceService/ModelInfer": TRITON_GRPC,
}

_SUFFIXES = (
    ("/chat/completions", OPENAI_CHAT),
    ("/completions", OPENAI_COMPLETIONS),
    ("/responses", RESPONSES),
    ("/v1/messages", ANTHROPIC),
    ("/api/generate", OLLAMA_GENERATE),
    ("/api/chat", OLLAMA_CHAT),
    ("/generate_stream", TGI_STREAM),
    ("/generate", TGI),
)


def route_for_path(path: str) -> Route:
    """The route of a request path (query string excluded)."""
    method = GRPC_METHODS.get(path)
    if method is not None:
        return method
    path = path.rstrip("/")
    if "/v2/models/" in path:
        found = _triton_route(path)
        if found is not None:
            return found
        if path.endswith(("/generate", "/generate_stream")):
            return OTHER_ROUTE  # Triton's shape, not one of its routes (a version not a number)
    for suffix, route in _SUFFIXES:
        if path.endswith(suffix):
            return route
    return OTHER_ROUTE


def _triton_route(path: str) -> Route | None:
    """Triton's generate routes, with the model their path names (bounded, as a body's is;
    the path is percent-decoded already); None for any other path."""
    found = _TRITON_PATH.search(path)
    if found is None:
        return None
    route = TRITON_STREAM if found.group(2) == "generate_stream" else TRITON
    return replace(route, model=found.group(1)[:MAX_MODEL_LENGTH])


def route_for_request(method: str, path: str) -> Route:
    """The route of a request: its path's, or TGI's compat route for a POST to the root."""
    if method == "POST" and not path.rstrip("/"):
        return TGI_COMPAT
    return route_for_path(path)


def route_for_grpc(route: Route, content_type: str) -> Route:
    """A request's route, given its Content-Type: a gRPC request on no measured method's
    path is ``OTHER_GRPC`` (its API ``grpc``, its answer a gRPC stream)."""
    if route is OTHER_ROUTE and detect_stream(content_type) == "grpc":
        return OTHER_GRPC
    return route


def detect_stream(content_type: str) -> Literal["sse", "ndjson", "json", "grpc", "other"]:
    """How to read a response body, from its Content-Type."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "text/event-stream":
        return "sse"
    if media == "application/grpc" or media.startswith("application/grpc+"):
        return "grpc"
    if media in ("application/x-ndjson", "application/ndjson", "application/jsonl"):
        return "ndjson"
    if media == "application/json" or media.endswith("+json"):
        return "json"
    return "other"
