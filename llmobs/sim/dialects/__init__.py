"""The APIs the sim speaks, each a renderer over the engine's token stream (see ``base``).

``endpoints_for`` picks the routes of one dialect, or of all of them, by the names that
``SimSettings.dialect`` accepts.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmobs.sim.dialects import anthropic, ollama, openai, responses, tgi, triton
from llmobs.sim.dialects.base import BadRequest, Context, Endpoint, Exchange

DIALECTS: Mapping[str, tuple[Endpoint, ...]] = {
    "openai": openai.ENDPOINTS,
    "ollama": ollama.ENDPOINTS,
    "tgi": tgi.ENDPOINTS,
    "anthropic": anthropic.ENDPOINTS,
    "responses": responses.ENDPOINTS,
    "triton": triton.ENDPOINTS,
}


def endpoints_for(dialect: str) -> tuple[Endpoint, ...]:
    """The routes served under ``dialect`` (``all``: every dialect's)."""
    if dialect == "all":
        return tuple(e for endpoints in DIALECTS.values() for e in endpoints)
    return DIALECTS[dialect]


__all__ = ["DIALECTS", "BadRequest", "Context", "Endpoint", "Exchange", "endpoints_for"]
