"""The sim's engine over gRPC, as the engines' own gRPC servers speak it (``--grpc-port``).

One grpc.aio server (h2c, on the sim's event loop) in front of the same ``SimEngine`` as the
HTTP application, so the timing, the counters and /metrics are the engine's whatever the API:

* ``vllm``: vLLM's ``vllm.grpc.engine.VllmEngine``;
* ``sglang``: SGLang's ``sglang.grpc.scheduler.SglangScheduler``;
* ``trtllm``: TensorRT-LLM's ``trtllm.TrtllmService`` (the three as smg-grpc-proto defines
  them, their Generate served by ``generate``);
* ``triton``: Triton's ``inference.GRPCInferenceService``, as TensorRT-LLM's ensemble answers
  it in decoupled mode (its tensors read and written by ``tensors``).

``serving`` is what they share (a request from its arrival to its end, the ids Abort names),
``server`` starts them all on one port. Imported only when the option asks for it (grpcio
and tritonclient take a fifth of a second to import).
"""

from __future__ import annotations

from llmobs.sim.grpc_engine.server import start_grpc

__all__ = ["start_grpc"]
