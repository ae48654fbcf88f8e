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

from llmobs.config.checks import (
    at_least_one,
    fraction,
    non_negative,
    not_blank,
    one_of,
    tcp_port,
)
from llmobs.config.options import (
    ConfigError,
    add_arguments,
    check_fields,
    flags_of,
    merge_sources,
    option,
    options_of,
    parse_bool,
    parse_list,
    source_of,
)
from llmobs.sim.dialects import ALL, DIALECTS, dialect_name
from llmobs.sim.faults import FAULT_MODES
from llmobs.sim.pd import NONE, PD_ROLES

SIM_DIALECTS = (ALL, *DIALECTS)  # what --dialect takes


def _lower(text: str) -> str:
    return text.strip().lower()


@dataclass(frozen=True)
class SimSettings:
    """The whole timing and fault model of the sim. Defaults resemble an 8B model on one GPU.
    Every field is an option (``LLMOBS_SIM_*``)."""

    host: str = option("127.0.0.1", str, "address the sim listens on", "ADDR")
    port: int = option(8000, int, "port the sim listens on", "PORT", check=tcp_port)
    model: str = option("sim-llama-3-8b", str, "model name served", "NAME", check=not_blank)
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
        check=at_least_one,
    )
    prefill_base: float = option(
        0.02,
        float,
        "seconds of prefill per admitted request ...",
        "SECONDS",
        check=non_negative,
    )
    prefill_per_token: float = option(
        0.0002,
        float,
        "... plus these seconds per prompt token",
        "SECONDS",
        check=non_negative,
    )
    decode_base: float = option(
        0.015,
        float,
        "seconds of one decode step (one token for every running request) ...",
        "SECONDS",
        check=non_negative,
    )
    decode_per_seq: float = option(
        0.0005,
        float,
        "... plus these seconds per running request",
        "SECONDS",
        check=non_negative,
    )
    output_tokens_min: int = option(
        32,
        int,
        "shortest output, in tokens (lengths are uniform between min and max)",
        "N",
        check=at_least_one,
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
        check=non_negative,
    )
    stall_ms: float = option(
        100.0,
        float,
        "milliseconds a stalled decode step takes in addition",
        "MS",
        check=non_negative,
    )
    spec_tokens: int = option(
        0,
        int,
        "draft tokens each running request proposes per decode step, counted as vLLM's "
        "speculative decoding counts them (the timing model does not change); 0: none",
        "N",
        check=non_negative,
    )
    spec_acceptance: float = option(
        0.7,
        float,
        "... of which this share is accepted (rounded down per request and step)",
        "FRACTION",
        check=fraction,
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
        check=non_negative,
    )
    error_rate: float = option(
        0.0,
        float,
        "fraction of requests answered with HTTP 500 (deterministic from the seed)",
        "FRACTION",
        check=fraction,
    )
    tokens_per_chunk: int = option(
        1,
        int,
        "tokens per SSE chunk after the first, like vLLM --stream-interval",
        "N",
        check=at_least_one,
    )
    dialect: str = option(
        ALL,
        dialect_name,
        f"API served: {', '.join(SIM_DIALECTS)} (one dialect keeps /health, /v1/models, /metrics)",
        "NAME",
        check=one_of(SIM_DIALECTS),
    )
    fault: str = option(
        "none",
        _lower,
        "break every completion response this way (see llmobs/sim/faults.py), or 'header': "
        "each request names its fault in X-Sim-Fault; 'none': no faults",
        "NAME",
        check=one_of(FAULT_MODES),
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

    pd_role: str = option(
        NONE,
        _lower,
        "disaggregated prefill/decode, as vLLM's NixlConnector: 'prefill' answers a request "
        "whose kv_transfer_params ask do_remote_decode with the params a decode engine pulls "
        "its KV cache by; 'decode' makes a request carrying them wait the KV transfer, then "
        "prefill its last token only; 'none': kv_transfer_params ignored",
        "ROLE",
        check=one_of(PD_ROLES),
    )
    kv_transfer_base: float = option(
        0.002,
        float,
        "seconds a decode leg waits for its KV cache (--pd-role decode), out of the batch ...",
        "SECONDS",
        check=non_negative,
    )
    kv_transfer_per_token: float = option(
        0.00001,
        float,
        "... plus these seconds per prompt token",
        "SECONDS",
        check=non_negative,
    )

    tls_cert_file: str = option(
        "", str, "serve HTTPS with this PEM certificate chain (as vLLM's --ssl-certfile), "
        "reloaded when it changes (as --enable-ssl-refresh)", "PATH",
    )  # fmt: skip
    tls_key_file: str = option(
        "", str, "the certificate's PEM private key (as vLLM's --ssl-keyfile)", "PATH"
    )

    http2: bool = option(
        False, parse_bool, "serve HTTP/2 too, on the same port: h2c with prior knowledge, and "
        "h2 by ALPN over TLS (an engine behind a gateway's h2c pool; the sidecar's "
        "--upstream-http2)", "BOOL",
    )  # fmt: skip

    tokenizer_path: str = option(
        "", str, "the tokenizer the gRPC APIs' GetModelInfo names (vLLM's and SGLang's "
        "tokenizer_path): a directory a gateway in front (smg) loads the model's tokenizer "
        "from, on its own filesystem; default: the model's name, as vLLM's", "PATH",
    )  # fmt: skip

    grpc_port: int | None = option(
        None, int, "serve the engines' gRPC APIs too, on this port (h2c; 0: one the system "
        "picks): vLLM's, SGLang's, TensorRT-LLM's and Triton's; default: off", "PORT",
        check=tcp_port,
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_fields(self, SIM_OPTIONS)  # each option's own bounds, then what binds two
        _check_lengths(self)
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError(
                f"{sim_source('tls_cert_file')} and {sim_source('tls_key_file')} go together: "
                "give both, or neither for plain HTTP"
            )

    @classmethod
    def from_sources(
        cls, environ: Mapping[str, str], flags: Mapping[str, Any] | None = None
    ) -> SimSettings:
        """Merge CLI flags (values that are not None) over environment over defaults."""
        return cls(**merge_sources(SIM_OPTIONS, environ, flags))


SIM_OPTIONS = options_of(SimSettings, "LLMOBS_SIM_")


def sim_source(field: str) -> str:
    """How a sim setting is given: its flag and variable."""
    return source_of(field, SIM_OPTIONS)


def _check_lengths(s: SimSettings) -> None:
    if s.output_tokens_max < s.output_tokens_min:
        raise ConfigError(
            f"{sim_source('output_tokens_max')}: must be >= output_tokens_min "
            f"({s.output_tokens_min}), got {s.output_tokens_max}"
        )


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sim's flags to ``parser`` (``llmobs sim`` and the demo use them)."""
    add_arguments(parser, SIM_OPTIONS)


def sim_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> SimSettings:
    """Build SimSettings from parsed CLI arguments and the environment."""
    return SimSettings.from_sources(environ, flags_of(args, SIM_OPTIONS))
