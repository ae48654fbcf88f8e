"""The gRPC server in front of the sim's engine: every API on one port (h2c), on the loop the
HTTP application runs on, sharing its ``SimEngine``.

Each API gives its service's descriptor and the methods it serves; the handlers are made from
the descriptor (each method's messages and whether it streams), so no generated servicer is
subclassed and a method not served answers UNIMPLEMENTED, as grpc does for any unknown one.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]
from google.protobuf import message_factory
from grpc import aio  # type: ignore[import-untyped, unused-ignore]

from llmobs.sim.engine import SimEngine
from llmobs.sim.grpc_engine import sglang, triton, trtllm, vllm
from llmobs.sim.grpc_engine.serving import Served, Service

# (client streams, server streams) -> how grpc wraps such a method
_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
APIS = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm, "triton": triton}
# grpc sets SO_REUSEPORT by default: a second sim on the same port would share it, unnoticed
_OPTIONS = [("grpc.so_reuseport", 0)]


def rpc_handler(api: Service) -> Any:
    """A service's generic handler: the methods it serves, their messages from its descriptor."""
    descriptor, behaviours = api
    handlers = {}
    for name, behaviour in behaviours.items():
        method = descriptor.methods_by_name[name]
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        kind = _KINDS[method.client_streaming, method.server_streaming]
        handlers[name] = kind(
            behaviour,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)


async def start_grpc(
    engine: SimEngine, host: str, port: int, apis: Collection[str] = tuple(APIS)
) -> tuple[Any, int]:
    """Serve the engine's gRPC APIs on ``host``:``port`` (0: a port the system picks) on the
    running loop; the started ``grpc.aio.Server`` (``await server.stop(grace)``) and its port.

    ``apis`` (names in ``APIS``) narrows them to those an engine of one kind serves: a gateway
    that detects the engine's kind by which API answers (smg asks every API's HealthCheck)
    then sees that engine alone. A port that cannot be bound raises the ``OSError`` a plain
    bind there raises.
    """
    unknown = set(apis) - APIS.keys()
    if unknown or not apis:
        raise ValueError(f"gRPC APIs are some of {', '.join(APIS)}; got {sorted(apis)}")
    served = Served(engine)
    server = aio.server(options=_OPTIONS)
    services = tuple(rpc_handler(APIS[name].service(served)) for name in APIS if name in apis)
    server.add_generic_rpc_handlers(services)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc's "Failed to bind to address ...", no more
        raise _why_not(host, port, str(exc)) from None
    await server.start()
    return server, int(bound)


def _why_not(host: str, port: int, told: str) -> OSError:
    """Why grpc could not bind (it says only that it failed): a plain bind's error there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host, port), family=family).close()
    except OSError as exc:
        return exc
    return OSError(told)
