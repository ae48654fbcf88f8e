"""The simulated inference engine: one known timing model behind every streaming API.

It is the default upstream of the demo, the tests and the benchmarks: continuous batching with
prefill and decode steps whose durations come from ``SimSettings``, optional stalls and
injected errors, all deterministic from a seed. See ``engine`` for the timing model,
``dialects`` for the APIs it speaks (OpenAI, Ollama, TGI, Anthropic, OpenAI Responses),
``faults`` for the broken-engine mode (resets, stalls, truncated or odd bodies) and ``pd`` for
either side of disaggregated prefill/decode (vLLM's NixlConnector over HTTP); ``grpc_engine``
serves the engines' gRPC APIs too (``--grpc-port``: vLLM, SGLang, TensorRT-LLM, Triton).
"""

from llmobs.sim.config import SimSettings, add_sim_arguments, sim_settings_from_args
from llmobs.sim.engine import SimEngine
from llmobs.sim.server import ENGINE_KEY, build_sim_app, run_sim

__all__ = [
    "ENGINE_KEY",
    "SimEngine",
    "SimSettings",
    "add_sim_arguments",
    "build_sim_app",
    "run_sim",
    "sim_settings_from_args",
]
