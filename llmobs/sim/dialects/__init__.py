"""The APIs the sim speaks, each a renderer over the engine's token stream (see ``base``).

Each is named as the sidecar names it on spans (``llmobs.dialect``, ``observe.dialects``), so
``llmobs sim --dialect``, the traffic tool and a span say the same word for the same API.
``endpoints_for`` picks the routes of one dialect, or of all of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmobs.observe.dialects import ANTHROPIC, OLLAMA_CHAT, OPENAI_CHAT, RESPONSES, TGI, TRITON
from llmobs.sim.dialects import anthropic, ollama, openai, responses, tgi, triton
from llmobs.sim.dialects.base import Api, BadRequest, Context, Endpoint, Exchange

ALL = "all"  # every dialect at once, each on its native paths
# each API: its routes, and a client's request in its shape (the traffic tool's)
DIALECTS: Mapping[str, Api] = {
    OPENAI_CHAT.name: openai.API,
    OLLAMA_CHAT.name: ollama.API,
    TGI.name: tgi.API,
    ANTHROPIC.name: anthropic.API,
    RESPONSES.name: responses.API,
    TRITON.name: triton.API,
}
# names earlier versions took on the command line, still accepted
_ALIASES = {"responses": RESPONSES.name}


def dialect_name(text: str) -> str:
    """A dialect as a user typed it (any case, an earlier name), as the sim and spans name it."""
    name = text.strip().lower()
    return _ALIASES.get(name, name)


def endpoints_for(dialect: str) -> tuple[Endpoint, ...]:
    """The routes served under ``dialect`` (``all``: every dialect's)."""
    if dialect == ALL:
        return tuple(e for api in DIALECTS.values() for e in api.endpoints)
    return DIALECTS[dialect].endpoints


__all__ = [
    "ALL",
    "DIALECTS",
    "Api",
    "BadRequest",
    "Context",
    "Endpoint",
    "Exchange",
    "dialect_name",
    "endpoints_for",
]
