"""/metrics as bytes: a registry that knows the order of its collectors, and its rendering.

``generate_latest`` would collect every family into prometheus_client's objects and format
them; the request series render themselves much faster (``series.SeriesCollector.render``),
so a registry is rendered collector by collector, each in the order it was registered (the
order ``generate_latest`` follows), the series by their own renderer and the rest by
``generate_latest``. The order comes from ``Registry``, which notes each collector as it is
registered through prometheus_client's public ``register``: no private state of the client is
read. A registry of another class, or one with target info, is rendered by
``generate_latest`` whole.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Executor

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from llmobs.metrics.series import SeriesCollector

CONTENT_TYPE = CONTENT_TYPE_LATEST  # the Prometheus text format, version 0.0.4


class Registry(CollectorRegistry):
    """A ``CollectorRegistry`` that keeps its collectors in the order they were registered."""

    def __init__(self) -> None:
        super().__init__()
        self._order: list[Collector] = []
        self._order_lock = threading.Lock()

    def register(self, collector: Collector) -> None:
        super().register(collector)  # raises on a duplicate: then nothing is noted
        with self._order_lock:
            self._order.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        with self._order_lock:
            self._order.remove(collector)

    def members(self) -> list[Collector]:
        """The collectors, in the order they were registered."""
        with self._order_lock:
            return list(self._order)


def _members(registry: CollectorRegistry) -> list[Collector] | None:
    """The collectors to render one by one, or None where the whole registry must go to
    ``generate_latest`` (another registry class, or target info to put first)."""
    if not isinstance(registry, Registry) or registry.get_target_info():
        return None
    return registry.members()


async def exposition_async(registry: CollectorRegistry, executor: Executor) -> bytes:
    """``exposition(registry)`` with the series rendered on the event loop a part at a time
    (a scrape never holds the loop for long), the other collectors in ``executor``."""
    loop = asyncio.get_running_loop()
    members = _members(registry)
    if members is None:
        return await loop.run_in_executor(executor, generate_latest, registry)
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            for part in collector.render_parts():
                parts.append(part.encode())
                await asyncio.sleep(0)
        else:
            parts.append(await loop.run_in_executor(executor, generate_latest, collector))
    return b"".join(parts)


def exposition(registry: CollectorRegistry) -> bytes:
    """The bytes ``generate_latest(registry)`` gives, every ``SeriesCollector`` rendered by its
    own ``render``, in the registry's order."""
    members = _members(registry)
    if members is None:
        return generate_latest(registry)
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            parts.append(collector.render().encode())
        else:
            parts.append(generate_latest(collector))
    return b"".join(parts)
