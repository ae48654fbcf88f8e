"""Settings of the simulated engine: one frozen ``SimSettings``, flags and ``LLMOBS_SIM_*``.

The sim is configured like the sidecar (``llmobs.config``: flag > environment > default, a bad
value fails at start-up naming its flag and variable) but from its own option table, so that
``llmobs sim --help`` lists exactly the knobs of the timing model and nothing of the proxy.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmobs.config import (
    ConfigError,
    Option,
    _parse_bool,
    add_arguments,
    flags_of,
    merge_sources,
    source_of,
)
from llmobs.sim.faults import FAULT_MODES

# The APIs the sim can speak; ``all`` serves every one at once, each on its native paths.
SIM_DIALECTS = ("all", "openai", "ollama", "tgi", "anthropic", "responses")


def _parse_dialect(text: str) -> str:
    return text.strip().lower()


SIM_OPTIONS: tuple[Option, ...] = (
    Option("host", "--host", "LLMOBS_SIM_HOST", str, "address the sim listens on", "ADDR"),
    Option("port", "--port", "LLMOBS_SIM_PORT", int, "port the sim listens on", "PORT"),
    Option("model", "--model", "LLMOBS_SIM_MODEL", str, "model name served", "NAME"),
    Option(
        "seed",
        "--seed",
        "LLMOBS_SIM_SEED",
        int,
        "seed of output lengths, words and injected errors (per request sequence number)",
        "N",
    ),
    Option(
        "max_batch",
        "--max-batch",
        "LLMOBS_SIM_MAX_BATCH",
        int,
        "most requests decoding at once; the rest wait in a FIFO queue",
        "N",
    ),
    Option(
        "prefill_base",
        "--prefill-base",
        "LLMOBS_SIM_PREFILL_BASE",
        float,
        "seconds of prefill per admitted request ...",
        "SECONDS",
    ),
    Option(
        "prefill_per_token",
        "--prefill-per-token",
        "LLMOBS_SIM_PREFILL_PER_TOKEN",
        float,
        "... plus these seconds per prompt token",
        "SECONDS",
    ),
    Option(
        "decode_base",
        "--decode-base",
        "LLMOBS_SIM_DECODE_BASE",
        float,
        "seconds of one decode step (one token for every running request) ...",
        "SECONDS",
    ),
    Option(
        "decode_per_seq",
        "--decode-per-seq",
        "LLMOBS_SIM_DECODE_PER_SEQ",
        float,
        "... plus these seconds per running request",
        "SECONDS",
    ),
    Option(
        "output_tokens_min",
        "--output-tokens-min",
        "LLMOBS_SIM_OUTPUT_TOKENS_MIN",
        int,
        "shortest output, in tokens (lengths are uniform between min and max)",
        "N",
    ),
    Option(
        "output_tokens_max",
        "--output-tokens-max",
        "LLMOBS_SIM_OUTPUT_TOKENS_MAX",
        int,
        "longest output, in tokens (a request's max_tokens caps it further)",
        "N",
    ),
    Option(
        "stall_every",
        "--stall-every",
        "LLMOBS_SIM_STALL_EVERY",
        int,
        "every N-th decode step (counted over all requests) stalls; 0 turns stalls off",
        "N",
    ),
    Option(
        "stall_ms",
        "--stall-ms",
        "LLMOBS_SIM_STALL_MS",
        float,
        "milliseconds a stalled decode step takes in addition",
        "MS",
    ),
    Option(
        "error_rate",
        "--error-rate",
        "LLMOBS_SIM_ERROR_RATE",
        float,
        "fraction of requests answered with HTTP 500 (deterministic from the seed)",
        "FRACTION",
    ),
    Option(
        "tokens_per_chunk",
        "--tokens-per-chunk",
        "LLMOBS_SIM_TOKENS_PER_CHUNK",
        int,
        "tokens per SSE chunk after the first, like vLLM --stream-interval",
        "N",
    ),
    Option(
        "dialect",
        "--dialect",
        "LLMOBS_SIM_DIALECT",
        _parse_dialect,
        f"API served: {', '.join(SIM_DIALECTS)} (one dialect keeps /health, /v1/models, /metrics)",
        "NAME",
    ),
    Option(
        "fault",
        "--fault",
        "LLMOBS_SIM_FAULT",
        _parse_dialect,
        "break every completion response this way (see llmobs/sim/faults.py), or 'header': "
        "each request names its fault in X-Sim-Fault; 'none' (default): no faults",
        "NAME",
    ),
    Option(
        "stamp",
        "--stamp",
        "LLMOBS_SIM_STAMP",
        _parse_bool,
        "put the engine's CLOCK_MONOTONIC send time in every OpenAI chunk (llmobs_sent_ns) and "
        "its receipt time in the first (llmobs_received_ns), for `llmobs bench`",
        "BOOL",
    ),
)


@dataclass(frozen=True)
class SimSettings:
    """The whole timing and fault model of the sim. Defaults resemble an 8B model on one GPU."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim-llama-3-8b"
    seed: int = 0
    max_batch: int = 16
    prefill_base: float = 0.02
    prefill_per_token: float = 0.0002
    decode_base: float = 0.015
    decode_per_seq: float = 0.0005
    output_tokens_min: int = 32
    output_tokens_max: int = 256
    stall_every: int = 0
    stall_ms: float = 100.0
    error_rate: float = 0.0
    tokens_per_chunk: int = 1
    dialect: str = "all"
    fault: str = "none"
    stamp: bool = False

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def from_sources(
        cls, environ: Mapping[str, str], flags: Mapping[str, Any] | None = None
    ) -> SimSettings:
        """Merge CLI flags (values that are not None) over environment over defaults."""
        return cls(**merge_sources(SIM_OPTIONS, environ, flags))


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
    ):
        value = getattr(s, name)
        if not value >= 0:  # also rejects NaN
            raise ConfigError(f"{_source(name)}: must be >= 0, got {value}")
    if s.output_tokens_max < s.output_tokens_min:
        raise ConfigError(
            f"{_source('output_tokens_max')}: must be >= output_tokens_min "
            f"({s.output_tokens_min}), got {s.output_tokens_max}"
        )
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
    add_arguments(parser, SIM_OPTIONS, SimSettings)


def sim_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> SimSettings:
    """Build SimSettings from parsed CLI arguments and the environment."""
    return SimSettings.from_sources(environ, flags_of(args, SIM_OPTIONS))
