"""Settings of the simulated engine: one frozen ``SimSettings``, flags and ``LLMOBS_SIM_*``.

The sim is configured like the sidecar (``llmobs.config.options``: flag > environment > default,
a bad value fails at start-up naming its flag and variable, each option declared once as a field)
but from its own settings, so that ``llmobs sim --help`` lists exactly the knobs of the timing
model and nothing of the proxy.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmobs.config.options import (
    ConfigError,
    add_arguments,
    flags_of,
    merge_sources,
    option,
    options_of,
    parse_bool,
    parse_list,
    source_of,
)
from llmobs.sim.faults import FAULT_MODES

# The APIs the sim can speak; ``all`` serves every one at once, each on its native paths.
SIM_DIALECTS = ("all", "openai", "ollama", "tgi", "anthropic", "responses", "triton")


def _parse_dialect(text: str) -> str:
    return text.strip().lower()


@dataclass(frozen=True)
class SimSettings:
    """The whole timing and fault model of the sim. Defaults resemble an 8B model on one GPU.
    Every field is an option (``LLMOBS_SIM_*``)."""

    host: str = option("127.0.0.1", str, "address the sim listens on", "ADDR")
    port: int = option(8000, int, "port the sim listens on", "PORT")
    model: str = option("sim-llama-3-8b", str, "model name served", "NAME")
    seed: int = option(
        0,
        int,
        "seed of output lengths, words and injected errors (per request sequence number)",
        "N",
    )
    max_batch: int = option(
        16,
        int,
        "most requests decoding at once; the rest wait in a FIFO queue",
        "N",
    )
    prefill_base: float = option(
        0.02,
        float,
        "seconds of prefill per admitted request ...",
        "SECONDS",
    )
    prefill_per_token: float = option(
        0.0002,
        float,
        "... plus these seconds per prompt token",
        "SECONDS",
    )
    decode_base: float = option(
        0.015,
        float,
        "seconds of one decode step (one token for every running request) ...",
        "SECONDS",
    )
    decode_per_seq: float = option(
        0.0005,
        float,
        "... plus these seconds per running request",
        "SECONDS",
    )
    output_tokens_min: int = option(
        32,
        int,
        "shortest output, in tokens (lengths are uniform between min and max)",
        "N",
    )
    output_tokens_max: int = option(
        256,
        int,
        "longest output, in tokens (a request's max_tokens caps it further)",
        "N",
    )
    stall_every: int = option(
        0,
        int,
        "every N-th decode step (counted over all requests) stalls; 0 turns stalls off",
        "N",
    )
    stall_ms: float = option(
        100.0,
        float,
        "milliseconds a stalled decode step takes in addition",
        "MS",
    )
    spec_tokens: int = option(
        0,
        int,
        "draft tokens each running request proposes per decode step, counted as vLLM's "
        "speculative decoding counts them (the timing model does not change); 0: none",
        "N",
    )
    spec_acceptance: float = option(
        0.7,
        float,
        "... of which this share is accepted (rounded down per request and step)",
        "FRACTION",
    )
    lora_adapters: tuple[str, ...] = option(
        (),
        parse_list,
        "LoRA adapters served besides the model (/v1/models lists each with the model as its "
        "parent, as vLLM does); requests may name any model anyway",
        "LIST",
    )
    kv_capacity: int = option(
        0,
        int,
        "tokens the KV cache holds (prompt and output of the running requests); a decode step "
        "that would overfill it preempts the latest admitted (recomputed later, as vLLM "
        "does); 0: no limit",
        "TOKENS",
    )
    error_rate: float = option(
        0.0,
        float,
        "fraction of requests answered with HTTP 500 (deterministic from the seed)",
        "FRACTION",
    )
    tokens_per_chunk: int = option(
        1,
        int,
        "tokens per SSE chunk after the first, like vLLM --stream-interval",
        "N",
    )
    dialect: str = option(
        "all",
        _parse_dialect,
        "API served: all, openai, ollama, tgi, anthropic, responses, triton (one dialect keeps "
        "/health, /v1/models, /metrics)",
        "NAME",
    )
    fault: str = option(
        "none",
        _parse_dialect,
        "break every completion response this way (see llmobs/sim/faults.py), or 'header': "
        "each request names its fault in X-Sim-Fault; 'none': no faults",
        "NAME",
    )
    stamp: bool = option(
        False,
        parse_bool,
        "put the engine's CLOCK_MONOTONIC send time in every OpenAI chunk (llmobs_sent_ns) "
        "and its receipt time in the first (llmobs_received_ns), for `llmobs bench`",
        "BOOL",
    )

    per_request_metrics: bool = option(
        False,
        parse_bool,
        "answer each OpenAI request with vLLM's per-request `metrics` (as vLLM's "
        "--enable-per-request-metrics: queue_time_ms, time_to_first_token_ms from scheduling, "
        "generation_time_ms), its final chunk's when streaming: the schedule's own times",
        "BOOL",
    )

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def from_sources(
        cls, environ: Mapping[str, str], flags: Mapping[str, Any] | None = None
    ) -> SimSettings:
        """Merge CLI flags (values that are not None) over environment over defaults."""
        return cls(**merge_sources(SIM_OPTIONS, environ, flags))


SIM_OPTIONS = options_of(SimSettings, "LLMOBS_SIM_")


def _source(field: str) -> str:
    return source_of(field, SIM_OPTIONS)


def _validate(s: SimSettings) -> None:
    if not 0 <= s.port <= 65535:
        raise ConfigError(f"{_source('port')}: port out of range: {s.port}")
    if not s.model.strip():
        raise ConfigError(f"{_source('model')}: must not be empty")
    for name in ("max_batch", "output_tokens_min", "tokens_per_chunk"):
        if getattr(s, name) < 1:
            raise ConfigError(f"{_source(name)}: must be >= 1, got {getattr(s, name)}")
    for name in (
        "prefill_base",
        "prefill_per_token",
        "decode_base",
        "decode_per_seq",
        "stall_every",
        "stall_ms",
        "kv_capacity",
    ):
        value = getattr(s, name)
        if not value >= 0:  # also rejects NaN
            raise ConfigError(f"{_source(name)}: must be >= 0, got {value}")
    if s.output_tokens_max < s.output_tokens_min:
        raise ConfigError(
            f"{_source('output_tokens_max')}: must be >= output_tokens_min "
            f"({s.output_tokens_min}), got {s.output_tokens_max}"
        )
    if not 0.0 <= s.spec_acceptance <= 1.0:
        raise ConfigError(f"{_source('spec_acceptance')}: must be within [0, 1]")
    if s.spec_tokens < 0:
        raise ConfigError(f"{_source('spec_tokens')}: must be >= 0, got {s.spec_tokens}")
    if not 0.0 <= s.error_rate <= 1.0:
        raise ConfigError(f"{_source('error_rate')}: must be within [0, 1], got {s.error_rate}")
    if s.dialect not in SIM_DIALECTS:
        raise ConfigError(
            f"{_source('dialect')}: expected one of {', '.join(SIM_DIALECTS)}, got {s.dialect!r}"
        )
    if s.fault not in FAULT_MODES:
        raise ConfigError(
            f"{_source('fault')}: expected one of {', '.join(FAULT_MODES)}, got {s.fault!r}"
        )


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sim's flags to ``parser`` (``llmobs sim`` and the demo use them)."""
    add_arguments(parser, SIM_OPTIONS)


def sim_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> SimSettings:
    """Build SimSettings from parsed CLI arguments and the environment."""
    return SimSettings.from_sources(environ, flags_of(args, SIM_OPTIONS))
