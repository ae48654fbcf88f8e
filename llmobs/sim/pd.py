"""Disaggregated prefill/decode as vLLM's NixlConnector speaks it over HTTP, for the sim.

A routing proxy (llm-d, vLLM's P/D proxy) sends the user's request first to a PREFILL engine
as a *prefill leg*: the body with ``kv_transfer_params`` asking ``do_remote_decode``, not
streamed, ``max_tokens`` 1. That engine answers with the ``kv_transfer_params`` a decode
engine needs to pull the prompt's KV cache (``kv_transfer_params``). The proxy then sends the
original body with those params to a DECODE engine as a *decode leg*: it waits for the
transfer (vLLM's WAITING_FOR_REMOTE_KVS), then recomputes only the last prompt token.

Only the reading and writing of the params is here; the transfer's timing is the engine's.
Imports nothing of the sim, so that the dialects and the settings can both use it.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass
from typing import Any

NONE = "none"
PREFILL = "prefill"
DECODE = "decode"
PD_ROLES = (NONE, PREFILL, DECODE)  # what --pd-role takes
BLOCK_SIZE = 16  # tokens per KV block, vLLM's default: a prompt's remote_block_ids count


class Leg(enum.Enum):
    """What a request is to this engine: served whole here, or one side of a P/D pair."""

    LOCAL = "local"  # prefilled and decoded here (no params, malformed ones, or no role)
    PREFILL = "prefill"  # a prefill leg: answer with the params a decode engine pulls by
    DECODE = "decode"  # a decode leg: pull the KV cache, then recompute the last token only


@dataclass(frozen=True)
class KvSource:
    """Where a decode engine pulls a prefill leg's KV cache from: this engine."""

    engine_id: str
    host: str
    port: int


def engine_id(seed: int, port: int) -> str:
    """A prefill engine's id: stable for one sim (its seed and port), distinct across sims."""
    return "sim-" + hashlib.blake2b(f"{seed}:{port}".encode(), digest_size=8).hexdigest()


def _asks_remote_decode(params: Any) -> bool:
    return isinstance(params, dict) and params.get("do_remote_decode") is True


def _brings_remote_kv(params: Any) -> bool:
    """The params a prefill engine answered with, as far as a decode engine needs them."""
    return (
        isinstance(params, dict)
        and params.get("do_remote_prefill") is True
        and isinstance(params.get("remote_block_ids"), list)
        and isinstance(params.get("remote_engine_id"), str)
    )


def leg_of(params: Any, role: str, stream: bool) -> Leg:
    """What a request's ``kv_transfer_params`` make it on an engine in ``role``. Anything
    malformed, or meant for the other role, is served locally, never refused; a prefill leg
    that asks to stream (no proxy does) is streamed as any request."""
    if role == PREFILL and not stream and _asks_remote_decode(params):
        return Leg.PREFILL
    if role == DECODE and _brings_remote_kv(params):
        return Leg.DECODE
    return Leg.LOCAL


def kv_transfer_params(
    source: KvSource, prompt_tokens: int, request_id: str | None
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill engine answers a prefill leg with, as vLLM's
    NixlConnector writes them: the decode engine is to pull ``remote_block_ids`` from it."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": source.engine_id,
        "remote_block_ids": list(range(math.ceil(prompt_tokens / BLOCK_SIZE))),
        "remote_host": source.host,
        "remote_port": source.port,
        "tp_size": 1,
        "remote_request_id": request_id,
    }
