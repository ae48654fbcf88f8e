"""gRPC engine APIs as dialects: a response stream's messages, decoded with the API's own
generated classes, and their token ids counted.

The APIs: vLLM's, SGLang's and TensorRT-LLM's ``Generate`` (a server stream of token ids; the
protos that the Shepherd Model Gateway and Dynamo speak, published as ``smg-grpc-proto``), and
Triton's ``ModelStreamInfer`` and ``ModelInfer`` (its protos from ``tritonclient``), imported
when a request first needs them (a fifth of a second, not at every start). A message is a
gRPC stream's payload (``framing.GrpcDecoder`` took off its prefix).

What is read per API:
- Generate: each ``chunk``'s ``token_ids`` (its output tokens, ``index`` its choice), the
  running ``prompt_tokens``/``completion_tokens``/``cached_tokens``; the ``complete`` message's
  ``finish_reason`` (and, for an answer not streamed, its ``output_ids``: all its tokens,
  counted as a JSON answer's usage is, not timed);
- Triton: each response with outputs is one token (TensorRT-LLM's streaming sends one per
  response) unless it carries ``num_output_tokens``; ``triton_final_response`` ends it;
  ``error_message`` is an error; the model from ``model_name``;
- every API: the status in the trailers (``grpc-status``; ``status_of``).
Requests (``read_request``): the stream flag, ``max_tokens`` and, for Triton, the model; for
the others, the model their engine's ``GetModelInfo`` answered (``ServedModel``).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, ClassVar

from llmobs.observe.dialects.base import MAX_MODEL_LENGTH, Dialect, normalize_finish

_SMG = "smg_grpc_proto.generated."
_TRITON = "tritonclient.grpc.service_pb2"
STATUS_OK = 0

# gRPC's status codes as an HTTP status, so that a gRPC request's outcome, status class and
# SLO verdict follow the HTTP rules (grpc-gateway's mapping, runtime/errors.go): a client's
# mistake is a 4xx, the engine's failure a 5xx. One change: UNIMPLEMENTED is 404, as gRPC's
# own mapping reads a 404 (doc/http-grpc-status-mapping.md), not 501: a method the engine
# does not serve is an unknown path, and gateways probe for the API an engine speaks (smg
# asks five), which must not read as the engine failing
_HTTP_STATUS = {
    0: 200, 1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409,
    11: 400, 12: 404, 13: 500, 14: 503, 15: 500, 16: 401,
}  # fmt: skip


def http_status(code: int) -> int:
    """The HTTP status a gRPC status code stands for (an unknown code: 500)."""
    return _HTTP_STATUS.get(code, 500)


def status_of(fields: list[tuple[str, str]]) -> int | None:
    """The ``grpc-status`` of trailers (or of a "trailers-only" head); None: absent or not a
    number (a broken peer's: the request is then judged by its HTTP status alone)."""
    for name, value in fields:
        if name.lower() == "grpc-status":
            text = value.strip()
            return int(text) if text.isdigit() and len(text) <= 3 else None
    return None


@functools.cache
def message_class(module: str, name: str) -> Any:
    """A generated message class, imported once it is first needed."""
    return getattr(importlib.import_module(module), name)


class GrpcDialect(Dialect):
    """A gRPC response stream: each message parsed into one reused instance of the API's
    response class (``RESPONSE`` in ``MODULE``), then read by ``on_message``."""

    __slots__ = ("_message", "grpc_status")

    MODULE: ClassVar[str] = ""
    RESPONSE: ClassVar[str] = ""
    REQUEST: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self._message = message_class(self.MODULE, self.RESPONSE)()
        self.grpc_status: int | None = None

    def on_data(self, data: bytes) -> int:
        message = self._message
        try:
            message.ParseFromString(data)
        except Exception:  # google.protobuf.message.DecodeError, and the like
            self.malformed += 1
            return 0
        return self.on_message(message)

    def on_message(self, message: Any) -> int:
        """Read one decoded message; return its output tokens."""
        raise NotImplementedError

    def on_object(self, obj: dict[str, Any]) -> int:
        return 0  # never JSON

    def on_status(self, code: int) -> None:
        """The call's status (its trailers): anything but OK is an error of the call."""
        self.grpc_status = code
        if code != STATUS_OK:
            self.error = True

    @classmethod
    def read_request(cls, message: bytes) -> tuple[bool | None, int | None, str | None]:
        """A request message's stream flag, max tokens and model (None: not said)."""
        request = message_class(cls.MODULE, cls.REQUEST)()
        request.ParseFromString(message)
        return cls.request_fields(request)

    @classmethod
    def request_fields(cls, request: Any) -> tuple[bool | None, int | None, str | None]:
        raise NotImplementedError


class GenerateStream(GrpcDialect):
    """vLLM's (and, by subclass, SGLang's and TensorRT-LLM's) ``Generate`` stream."""

    __slots__ = ("_chunks",)

    MODULE = _SMG + "vllm_engine_pb2"
    RESPONSE = "GenerateResponse"
    REQUEST = "GenerateRequest"
    OUTPUT_IDS: ClassVar[str] = "output_ids"  # the complete message's tokens
    CHOICE: ClassVar[str] = "index"  # which of n sequences a message is

    def __init__(self) -> None:
        super().__init__()
        self._chunks = 0

    def on_message(self, message: Any) -> int:
        kind = message.WhichOneof("response")
        if kind == "chunk":
            chunk = message.chunk
            self._usage(chunk)
            self._chunks += 1
            self.per_chunk_usage = True  # token ids: exact, not assumed one per message
            return self.output(len(chunk.token_ids), getattr(chunk, self.CHOICE))
        if kind == "complete":
            complete = message.complete
            self._usage(complete)
            self.finish(complete.finish_reason)
            self.done = True
            if not self._chunks and self.output_tokens is None:  # an answer not streamed:
                self.output_tokens = len(getattr(complete, self.OUTPUT_IDS))  # counted, untimed
        return 0

    def _usage(self, part: Any) -> None:
        """The running counts a chunk or the complete message carries (0: not said)."""
        if part.prompt_tokens:
            self.input_tokens = part.prompt_tokens
        if part.completion_tokens:
            self.output_tokens = part.completion_tokens
        if part.cached_tokens:
            self.cached_tokens = part.cached_tokens

    @classmethod
    def request_fields(cls, request: Any) -> tuple[bool | None, int | None, str | None]:
        params = request.sampling_params
        limit = params.max_tokens if params.HasField("max_tokens") else None
        return request.stream, limit, None


class SglangStream(GenerateStream):
    """SGLang's scheduler ``Generate``: vLLM's shape, ``max_new_tokens`` for the limit."""

    __slots__ = ()

    MODULE = _SMG + "sglang_scheduler_pb2"

    @classmethod
    def request_fields(cls, request: Any) -> tuple[bool | None, int | None, str | None]:
        params = request.sampling_params
        limit = params.max_new_tokens if params.HasField("max_new_tokens") else None
        return request.stream, limit, None


class TrtllmStream(GenerateStream):
    """TensorRT-LLM's ``Generate``: its sequences by ``sequence_index``, its tokens in
    ``output_token_ids``, the limit and stream flag at the request's top level."""

    __slots__ = ()

    MODULE = _SMG + "trtllm_service_pb2"
    OUTPUT_IDS = "output_token_ids"
    CHOICE = "sequence_index"

    @classmethod
    def request_fields(cls, request: Any) -> tuple[bool | None, int | None, str | None]:
        return request.streaming, request.max_tokens or None, None


class TritonGrpcStream(GrpcDialect):
    """Triton's ``ModelStreamInfer`` (and ``ModelInfer``'s one answer): a response per model
    response, TensorRT-LLM's decoupled models one per token."""

    __slots__ = ()

    MODULE = _TRITON
    RESPONSE = "ModelStreamInferResponse"
    REQUEST = "ModelInferRequest"

    def on_message(self, message: Any) -> int:
        if message.error_message:
            self.error = True
            self.finish("error")
            return 0
        return self.on_response(message.infer_response)

    def on_response(self, response: Any) -> int:
        """One model response: its tokens, its model, whether it is the last."""
        if response.model_name and self.response_model is None:
            self.response_model = response.model_name[:MAX_MODEL_LENGTH]
        final = response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            self.done = True
        if not response.outputs:
            return 0  # an empty final response (or one with no tensors)
        counted = _num_output_tokens(response)
        return self.output(counted if counted is not None else 1)

    @classmethod
    def request_fields(cls, request: Any) -> tuple[bool | None, int | None, str | None]:
        model = request.model_name[:MAX_MODEL_LENGTH] or None
        return None, None, model


class TritonInfer(TritonGrpcStream):
    """Triton's unary ``ModelInfer``: one ``ModelInferResponse``, its outputs whole."""

    __slots__ = ()

    RESPONSE = "ModelInferResponse"

    def on_message(self, message: Any) -> int:
        """The whole answer: its tokens counted (TensorRT-LLM's ``num_output_tokens``, when
        asked for), not timed, as a JSON answer's."""
        self.done = True
        if message.model_name and self.response_model is None:
            self.response_model = message.model_name[:MAX_MODEL_LENGTH]
        if message.outputs:
            self.output_tokens = _num_output_tokens(message)
        return 0


class ServedModel:
    """The model an engine's gRPC API serves: its Generate requests name none (a gateway that
    tokenizes picks the engine, not a model), so it is learned from the ``GetModelInfo``
    answers the sidecar relays (a gateway asks when it registers the engine: smg, Dynamo).
    One per sidecar; None until an answer named it."""

    __slots__ = ("name",)

    def __init__(self) -> None:
        self.name: str | None = None


class ModelInfoReply(GrpcDialect):
    """vLLM's ``GetModelInfo`` answer: the served model's name (``served_model_name``, else
    ``model_path``), kept as the response's model for ``ServedModel``."""

    __slots__ = ()

    MODULE = _SMG + "vllm_engine_pb2"
    RESPONSE = "GetModelInfoResponse"
    REQUEST = "GetModelInfoRequest"
    NAMES: ClassVar[tuple[str, ...]] = ("served_model_name", "model_path")

    def on_message(self, message: Any) -> int:
        self.done = True
        for field in self.NAMES:
            name = getattr(message, field, "")
            if name:
                self.response_model = name[:MAX_MODEL_LENGTH]
                break
        return 0

    @classmethod
    def request_fields(cls, request: Any) -> tuple[bool | None, int | None, str | None]:
        return None, None, None


class SglangModelInfo(ModelInfoReply):
    """SGLang's: the same fields."""

    __slots__ = ()

    MODULE = _SMG + "sglang_scheduler_pb2"


class TrtllmModelInfo(ModelInfoReply):
    """TensorRT-LLM's: ``model_id``."""

    __slots__ = ()

    MODULE = _SMG + "trtllm_service_pb2"
    NAMES = ("model_id",)


def _num_output_tokens(response: Any) -> int | None:
    """TensorRT-LLM's ``num_output_tokens`` output, when the response carries it."""
    for i, tensor in enumerate(response.outputs):
        if tensor.name == "num_output_tokens":
            if tensor.contents.int_contents:
                return int(tensor.contents.int_contents[0])
            raw = response.raw_output_contents
            if i < len(raw) and len(raw[i]) >= 4:
                return int.from_bytes(raw[i][:4], "little", signed=True)
    return None


__all__ = [
    "GenerateStream",
    "GrpcDialect",
    "ModelInfoReply",
    "ServedModel",
    "SglangModelInfo",
    "SglangStream",
    "TritonGrpcStream",
    "TritonInfer",
    "TrtllmModelInfo",
    "TrtllmStream",
    "http_status",
    "normalize_finish",
    "status_of",
]
