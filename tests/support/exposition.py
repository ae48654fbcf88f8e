"""/metrics as a test (or a benchmark) reads it: rendered the admin app's way outside an event
loop, and a protobuf exposition read back into its ``MetricFamily`` messages, as a scraper
does. Here, not in the package, because only tests and benchmarks call them."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry

from llmobs.export.metrics.client_model import MetricFamily
from llmobs.export.metrics.exposition import Format, render


def rendered(registry: CollectorRegistry, fmt: Format = Format.TEXT) -> bytes:
    """The bytes /metrics serves for ``registry`` in ``fmt`` (``exposition.render``, on a
    loop of its own, the other collectors in a thread of their own)."""

    async def run() -> bytes:
        with ThreadPoolExecutor(1) as pool:
            return await render(fmt, registry, pool)

    return asyncio.run(run())


def read_delimited(data: bytes) -> list[Any]:
    """The ``MetricFamily`` messages of a delimited stream (what a scraper does with it)."""
    out = []
    i = 0
    while i < len(data):
        length = shift = 0
        while True:
            byte = data[i]
            i += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        out.append(MetricFamily.FromString(data[i : i + length]))
        i += length
    return out
