"""The ``gen_ai.provider.name`` of a sidecar's telemetry: the engine that serves its requests.

The GenAI conventions require it on their metrics and spans and name no value for a
self-hosted engine ("a custom value MAY be used"): llmobs names the engine as the engine
collector recognises it from its metrics (``vllm``, ``sglang``, ...); where those name no
engine (Ollama has none, Triton's are on another port), the engine whose own API a request the
engine answered with a 2xx spoke (Ollama's, Triton's; not TGI's ``/generate``, which SGLang
serves too); until then ``unknown``. The operator's ``--provider-name`` overrides all of it.
Resolved once: a sidecar's provider changes at most once, from ``unknown``, and never back.
"""

from __future__ import annotations

from collections.abc import Callable

from llmobs.observe.labels import UNKNOWN

AUTO = "auto"

# the dialects (observe.dialects.Route.name) only one kind of engine speaks
DIALECT_PROVIDERS = {"ollama": "ollama", "triton": "triton"}


class Provider:
    """The provider name, and who is told when it is found (the sink rebinds its series).

    ``engine_metrics``: whether an engine collector will try to name the engine; until it
    has answered (a known engine, or metrics that name none), requests' dialects are not
    taken as the answer."""

    __slots__ = ("_listeners", "_waiting", "name", "settled")

    def __init__(self, configured: str = AUTO, engine_metrics: bool = True) -> None:
        self.settled = configured != AUTO
        self.name = configured if self.settled else UNKNOWN
        self._waiting = engine_metrics and not self.settled
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def engine(self, engine: str | None) -> None:
        """What the engine's metrics said: the engine as a provider name (the collector's
        ``collectors.engine.PROVIDERS``), or None (they name no known engine)."""
        self._waiting = False
        if engine is not None:
            self._settle(engine)

    def dialect(self, dialect: str) -> None:
        """A request's dialect: the answer when it is one engine's own and the engine's
        metrics named none (or none are read)."""
        provider = DIALECT_PROVIDERS.get(dialect)
        if provider is not None and not self._waiting:
            self._settle(provider)

    def _settle(self, name: str) -> None:
        if self.settled:
            return
        self.settled = True
        self.name = name
        for listener in self._listeners:
            listener(name)
