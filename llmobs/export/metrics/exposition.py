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

The same holds for OpenMetrics, the series' frames with their exemplars written by
``openmetrics``, and for Prometheus' protobuf format, which prometheus_client cannot write:
the series' frames, with their native buckets, and the other collectors' families are
encoded by ``protobuf``. Each format is a ``_Writer``; one loop (``render``) walks the
registry for all three.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass

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


class Format(enum.Enum):
    """An exposition format /metrics can answer in: its content type."""

    TEXT = CONTENT_TYPE_LATEST  # the Prometheus text format, version 0.0.4
    OPENMETRICS = OPENMETRICS_LATEST  # OpenMetrics 1.0 text: with exemplars
    PROTOBUF = protobuf.CONTENT_TYPE  # delimited MetricFamily: with native histograms


# On equal preference, the richer format (Prometheus lists them best first anyway).
_RANK = {Format.PROTOBUF: 2, Format.OPENMETRICS: 1, Format.TEXT: 0}


def _entries(header: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Each entry of an Accept or Accept-Encoding header, parsed once: its value (lower
    case), its parameters by name, and its quality (RFC 9110 12.4.2): 1 when absent, 0 when
    it is not one (NaN, negative, above 1, not a number)."""
    for item in header.split(","):
        value, *params = (part.strip() for part in item.split(";"))
        named = {}
        for param in params:
            name, _, text = param.partition("=")
            named[name.strip().lower()] = text.strip().strip('"')
        try:
            quality = float(named.get("q", "1"))
        except ValueError:
            quality = 0.0
        yield value.lower(), named, quality if 0.0 <= quality <= 1.0 else 0.0


def _format(media: str, params: dict[str, str]) -> Format | None:
    """The format an Accept entry names; None: none we write (the text and compact-text
    protobuf encodings among them)."""
    if media == protobuf.MEDIA_TYPE:
        delimited = params.get("proto") == protobuf.PROTO and params.get("encoding") == "delimited"
        return Format.PROTOBUF if delimited else None
    if media == _OPENMETRICS:
        return Format.OPENMETRICS
    if media in ("text/plain", "*/*", "text/*"):
        return Format.TEXT
    return None


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether the scraper takes gzip (RFC 9110 12.5.3: ``gzip`` or ``*`` with a quality
    above 0, ``gzip`` named first); Prometheus sends ``Accept-Encoding: gzip``."""
    wildcard = None
    for coding, _, quality in _entries(accept_encoding):
        if coding in ("gzip", "x-gzip"):
            return quality > 0
        if coding == "*":
            wildcard = quality > 0
    return bool(wildcard)


def negotiate(accept: str) -> Format:
    """Content negotiation (RFC 9110 12.5.1, as Prometheus' scrape Accept header uses it): the
    format the scraper likes best, the richer one on a tie; the text format when it names
    none we write (no header, ``*/*``, ``text/plain``, ``application/json``)."""
    best = {fmt: 0.0 for fmt in Format}
    for media, params, quality in _entries(accept):
        fmt = _format(media, params)
        if fmt is not None:
            best[fmt] = max(best[fmt], quality)
    chosen = max(Format, key=lambda fmt: (best[fmt], _RANK[fmt]))
    return chosen if best[chosen] > 0 else Format.TEXT


@dataclass(frozen=True)
class _Writer:
    """How a format is written: the request series' frames a part at a time (on the event
    loop), another collector whole (in the executor), a registry that cannot be rendered
    collector by collector (``_members``), and what ends the exposition."""

    series: Callable[[SeriesCollector], Iterable[bytes]]
    other: Callable[[Collector], bytes]
    whole: Callable[[CollectorRegistry], bytes]
    end: bytes = b""


def _openmetrics_member(collector: Collector) -> bytes:
    """One collector in OpenMetrics: the writer's bytes without the end, which comes once."""
    written: bytes = openmetrics_latest(collector)  # type: ignore[no-untyped-call]
    return written.removesuffix(openmetrics.EOF)


def _families_bytes(collector: Collector) -> bytes:
    """A collector's families in protobuf (a registry's too, from ``collect()``: classic
    buckets only, its series have no native ones there)."""
    return b"".join(protobuf.family_bytes(family) for family in collector.collect())


def _writer(fmt: Format) -> _Writer:
    """The writer of ``fmt``: the series' own encoder, prometheus_client's writer (or
    ``protobuf``'s, which prometheus_client lacks) for the rest."""
    if fmt is Format.PROTOBUF:
        return _Writer(
            lambda c: protobuf.parts(c.frames(exemplars=True, natives=True)),
            _families_bytes, _families_bytes,
        )  # fmt: skip
    if fmt is Format.OPENMETRICS:
        return _Writer(
            lambda c: openmetrics.parts(c.frames(exemplars=True)),
            _openmetrics_member, openmetrics_latest, openmetrics.EOF,
        )  # fmt: skip
    return _Writer(lambda c: text.parts(c.frames()), generate_latest, generate_latest)


async def render(fmt: Format, registry: CollectorRegistry, executor: Executor) -> bytes:
    """/metrics in ``fmt``, in the registry's order: the request series on the event loop a
    part at a time (a scrape never holds the loop for long; prometheus_client's writers would
    build every family's objects first, at the label cap too: docs/benchmarks.md), the other
    collectors in ``executor``."""
    writer = _writer(fmt)
    loop = asyncio.get_running_loop()
    members = _members(registry)
    if members is None:
        return await loop.run_in_executor(executor, writer.whole, registry)
    parts: list[bytes] = []
    for collector in members:
        if isinstance(collector, SeriesCollector):
            for part in writer.series(collector):
                parts.append(part)
                await asyncio.sleep(0)
        else:
            parts.append(await loop.run_in_executor(executor, writer.other, collector))
    parts.append(writer.end)
    return b"".join(parts)
