"""OpenMetrics 1.0 text of the request series: frames (``frames.Frame``) as the bytes
prometheus_client's OpenMetrics writer gives for the same families, with their exemplars.

The sample lines are the text format's (``text``), so they come from its writer and its kept
text; what differs is written here: a family's header (the writer's own, taken once per shape
from an empty family: a counter is named without ``_total``), the exemplar after a bucket
line's value, and the closing ``# EOF`` (``EOF``, after every collector's families).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import cast
from weakref import WeakKeyDictionary

from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.registry import Collector

from llmobs.export.metrics import text
from llmobs.export.metrics.frames import Exemplar, Frame, Shape, client_family

EOF = b"# EOF\n"
_latest = cast(Callable[[Collector], bytes], generate_latest)


class _Empty(Collector):
    """One family with no samples: what the OpenMetrics writer gives for it is its header."""

    def __init__(self, shape: Shape) -> None:
        self._shape = shape

    def collect(self) -> Iterable[Metric]:
        return (client_family(Frame(self._shape, [], [])),)


_HEADS: WeakKeyDictionary[Shape, str] = WeakKeyDictionary()


def head(shape: Shape) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family as the OpenMetrics writer writes them."""
    found = _HEADS.get(shape)
    if found is None:
        found = _HEADS[shape] = _latest(_Empty(shape)).decode().removesuffix(EOF.decode())
    return found


def exemplar(found: Exemplar) -> str:
    """A bucket line's exemplar, as the OpenMetrics writer writes one."""
    trace_id, span_id, value, at = found
    return f' # {{span_id="{span_id}",trace_id="{trace_id}"}} {text.go(value)} {at}'


def parts(frames: Iterable[Frame], lines: int = 1000) -> Iterator[bytes]:
    """The families in OpenMetrics, with their exemplars (frames made with them), in parts of
    about ``lines`` lines; without the closing ``EOF``."""
    return text.lines_of(frames, head, exemplar, lines)
