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
``server`` starts them all on one port. An optional extra (``llmobs[grpc]``): imported only
when the option asks for it; without it the import fails with the one line that says so.
"""

from __future__ import annotations

try:
    import grpc  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
    import smg_grpc_proto  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
    import tritonclient.grpc  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed where tests run
    raise ImportError(
        f"the sim's gRPC APIs need {exc.name}: pip install 'llmobs[grpc]'", name=exc.name
    ) from None

from llmobs.sim.grpc_engine.server import start_grpc

__all__ = ["start_grpc"]
