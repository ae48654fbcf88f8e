"""/metrics as bytes: a registry that knows the order of its collectors, the format a scraper
asks for (``negotiate``), and the rendering in it (``render``).

``generate_latest`` would collect every family into prometheus_client's objects and format
them; the request series' frames are written much faster by an encoder of their own
(``text``), so a registry is rendered collector by collector, each in the order it was
registered (the order ``generate_latest`` follows), the series by the encoder and the rest by
``generate_latest``. The order comes from ``Registry``, which notes each collector as it is
registered through prometheus_client's public ``register``: no private state of the client is
read. A registry of another class, or one with target info, is rendered by
``generate_latest`` whole.

The same holds for OpenMetrics (``openmetrics_async``): the series' frames, with their
exemplars, go to ``openmetrics``, the other collectors to prometheus_client's OpenMetrics
writer. And for Prometheus' protobuf format (``protobuf_async``), which prometheus_client
cannot write: the series' frames, with their native buckets, and the other collectors'
families are encoded by ``protobuf``.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from concurrent.futures import Executor

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_LATEST
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector

from llmobs.export.metrics import openmetrics, protobuf, text
from llmobs.export.metrics.series import SeriesCollector

_OPENMETRICS = "application/openmetrics-text"


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
            for part in text.parts(collector.frames()):
                parts.append(part)
                await asyncio.sleep(0)
        else:
            parts.append(await loop.run_in_executor(executor, generate_latest, collector))
    return b"".join(parts)


def exposition(registry: CollectorRegistry) -> bytes:
    """The bytes ``generate_latest(registry)`` gives, every ``SeriesCollector``'s frames
    written by ``text``, in the registry's order."""
    members = _members(registry)
    if members is None:
        return generate_latest(registry)
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            parts.append(text.render(collector.frames()))
        else:
            parts.append(generate_latest(collector))
    return b"".join(parts)


class Format(enum.Enum):
    """An exposition format /metrics can answer in: its content type."""

    TEXT = CONTENT_TYPE_LATEST  # the Prometheus text format, version 0.0.4
    OPENMETRICS = OPENMETRICS_LATEST  # OpenMetrics 1.0 text: with exemplars
    PROTOBUF = protobuf.CONTENT_TYPE  # delimited MetricFamily: with native histograms


# On equal preference, the richer format (Prometheus lists them best first anyway).
_RANK = {Format.PROTOBUF: 2, Format.OPENMETRICS: 1, Format.TEXT: 0}


def _media(item: str) -> tuple[Format | None, float]:
    """The format one Accept entry names (None: none we write) and its quality."""
    media, *params = (part.strip() for part in item.split(";"))
    values = {}
    for param in params:
        name, _, value = param.partition("=")
        values[name.strip().lower()] = value.strip().strip('"')
    try:
        quality = float(values.get("q", "1"))
    except ValueError:
        quality = 0.0
    if not 0.0 <= quality <= 1.0:  # NaN, negative, above 1: not a quality (RFC 9110 12.4.2)
        quality = 0.0
    media = media.lower()
    if media == protobuf.MEDIA_TYPE:
        if values.get("proto") != protobuf.PROTO or values.get("encoding") != "delimited":
            return None, 0.0  # the text and compact-text protobuf encodings: not written
        return Format.PROTOBUF, quality
    if media == _OPENMETRICS:
        return Format.OPENMETRICS, quality
    if media in ("text/plain", "*/*", "text/*"):
        return Format.TEXT, quality
    return None, 0.0


def _quality(params: list[str]) -> float:
    """An Accept or Accept-Encoding entry's ``q`` (RFC 9110 12.4.2): 1 when absent, 0 when
    it is not a quality (NaN, negative, above 1, not a number)."""
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                quality = float(value.strip().strip('"'))
            except ValueError:
                return 0.0
            return quality if 0.0 <= quality <= 1.0 else 0.0
    return 1.0


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether the scraper takes gzip (RFC 9110 12.5.3: ``gzip`` or ``*`` with a quality
    above 0, ``gzip`` named first); Prometheus sends ``Accept-Encoding: gzip``."""
    wildcard = None
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        coding = coding.lower()
        if coding in ("gzip", "x-gzip"):
            return _quality(params) > 0
        if coding == "*":
            wildcard = _quality(params) > 0
    return bool(wildcard)


def negotiate(accept: str) -> Format:
    """Content negotiation (RFC 9110 12.5.1, as Prometheus' scrape Accept header uses it): the
    format the scraper likes best, the richer one on a tie; the text format when it names
    none we write (no header, ``*/*``, ``text/plain``, ``application/json``)."""
    best = {fmt: 0.0 for fmt in Format}
    for item in accept.split(","):
        fmt, quality = _media(item)
        if fmt is not None:
            best[fmt] = max(best[fmt], quality)
    chosen = max(Format, key=lambda fmt: (best[fmt], _RANK[fmt]))
    return chosen if best[chosen] > 0 else Format.TEXT


async def protobuf_async(registry: CollectorRegistry, executor: Executor) -> bytes:
    """The registry in Prometheus' protobuf format: each family a delimited ``MetricFamily``,
    in the registry's order; the request series (with their native buckets and exemplars)
    encoded on the event loop a part at a time, the other collectors in ``executor``. A
    registry of another class (or with target info, which llmobs never sets) is encoded whole
    from ``collect()``: classic buckets only, its series have no native ones there."""
    loop = asyncio.get_running_loop()
    members = _members(registry)
    if members is None:
        members = [registry]
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            for part in protobuf.parts(collector.frames(exemplars=True, natives=True)):
                parts.append(part)
                await asyncio.sleep(0)
        else:
            parts.append(await loop.run_in_executor(executor, _families_bytes, collector))
    return b"".join(parts)


def _families_bytes(collector: Collector | CollectorRegistry) -> bytes:
    return b"".join(protobuf.family_bytes(family) for family in collector.collect())


async def render(fmt: Format, registry: CollectorRegistry, executor: Executor) -> bytes:
    """/metrics in ``fmt``."""
    if fmt is Format.PROTOBUF:
        return await protobuf_async(registry, executor)
    if fmt is Format.OPENMETRICS:
        return await openmetrics_async(registry, executor)
    return await exposition_async(registry, executor)


async def openmetrics_async(registry: CollectorRegistry, executor: Executor) -> bytes:
    """The bytes prometheus_client's OpenMetrics writer gives for ``registry``, the series
    (with their exemplars) written on the event loop a part at a time, as for the text
    format: the writer would build every family's objects first, and hold the loop for it
    at the label cap (docs/benchmarks.md)."""
    loop = asyncio.get_running_loop()
    members = _members(registry)
    if members is None:
        return await loop.run_in_executor(executor, openmetrics_latest, registry)
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            for part in openmetrics.parts(collector.frames(exemplars=True)):
                parts.append(part)
                await asyncio.sleep(0)
        else:
            written = await loop.run_in_executor(executor, openmetrics_latest, collector)
            parts.append(written.removesuffix(openmetrics.EOF))
    parts.append(openmetrics.EOF)
    return b"".join(parts)
