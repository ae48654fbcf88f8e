"""The Prometheus text format (0.0.4) of the request series: frames (``frames.Frame``) as the
bytes ``generate_latest`` writes for the same families, a part at a time.

Not ``generate_latest`` itself: it would build prometheus_client's family and sample objects
first, which at the label cap is most of a scrape's time and, through the collections of that
many tracked objects, the relay's loop waiting (docs/benchmarks.md). Here each series' text up
to its value (name, ``{labels}`` escaped and sorted, ``le``) is made the first time the series
is written and kept with its shape (series live as long as the process): a scrape formats only
the values. OpenMetrics (``openmetrics``) writes the same lines but for its header and the
exemplars. ``tests/unit/export/metrics/test_text.py`` and ``test_openmetrics.py`` hold both to
prometheus_client's writers byte for byte.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import cast
from weakref import WeakKeyDictionary

from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString as _untyped_go

from llmobs.export.metrics.frames import Exemplar, Frame, Key, Number, Shape, Type

# A sample's value as ``generate_latest`` writes it (Go's float formatting).
go = cast(Callable[[Number], str], _untyped_go)
# A format's header lines of a family; the text after a bucket line's value that shows its
# exemplar (None: a format without exemplars).
Head = Callable[[Shape], str]
Suffix = Callable[[Exemplar], str]


def _label_value(value: str) -> str:
    """A label value as ``generate_latest`` escapes it (backslash, newline, double quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _prefix(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """A sample line up to its value: ``name{a="x",b="y"} `` (labels sorted by name)."""
    text = ",".join(f'{escape_label_name(k)}="{_label_value(v)}"' for k, v in sorted(labels))
    if not text:
        return f"{escape_metric_name(name)} "
    return f"{escape_metric_name(name)}{{{text}}} "


class _Lines:
    """What a shape's lines are up to their values: a counter's one line per series, or a
    histogram's bucket lines then _count and _sum; and its header in this format."""

    __slots__ = ("edges", "head", "histograms", "samples")

    def __init__(self, shape: Shape) -> None:
        doc = shape.help.replace("\\", r"\\").replace("\n", r"\n")
        name = escape_metric_name(shape.name)
        self.head = f"# HELP {name} {doc}\n# TYPE {name} {shape.type.value}\n"
        self.edges = shape.edges()
        self.samples: dict[Key, str] = {}
        self.histograms: dict[Key, tuple[str, ...]] = {}


_LINES: WeakKeyDictionary[Shape, _Lines] = WeakKeyDictionary()


def _lines(shape: Shape) -> _Lines:
    found = _LINES.get(shape)
    if found is None:
        found = _LINES[shape] = _Lines(shape)
    return found


def _histogram_text(shape: Shape, edges: list[str], key: Key) -> tuple[str, ...]:
    """Each bucket line of a series up to its value, then the _count and _sum lines (if any)."""
    name = escape_metric_name(shape.name)
    labels = dict(zip(shape.labels, key, strict=False))
    if "le" in labels:  # generate_latest's le replaces it
        text = [_prefix(f"{name}_bucket", {**labels, "le": e}.items()) for e in edges]
    else:  # the labels sorted by name, le among them
        pairs = [(k, f'{escape_label_name(k)}="{_label_value(v)}"') for k, v in labels.items()]
        pairs.sort()
        head = "".join(f"{text}," for k, text in pairs if k < "le")
        tail = "".join(f",{text}" for k, text in pairs if k > "le")
        text = [f'{name}_bucket{{{head}le="{e}"{tail}}} ' for e in edges]
    if shape.bounds and shape.bounds[0] < 0:  # no _count, _sum with negative buckets
        return tuple(text)
    pairs_ = labels.items()
    return (*text, _prefix(f"{name}_count", pairs_), _prefix(f"{name}_sum", pairs_))


def _histogram(frame: Frame, out: list[str], start: int, stop: int, suffix: Suffix | None) -> None:
    """Append the lines of series ``start`` to ``stop``; with ``suffix``, each bucket line
    that has an exemplar in the frame shows it."""
    shape, keys, values = frame.shape, frame.keys, frame.values
    lines = _lines(shape)
    cache, edges = lines.histograms, lines.edges
    exemplars = frame.exemplars if suffix is not None else None
    show = suffix or _no_exemplar  # called only where there are exemplars: with a suffix
    size = shape.size
    go_: dict[Number, str] = {}  # cumulative count -> text (counts repeat across buckets)
    j = start * (size + 1)
    for key in keys[start:stop] if stop >= 0 else keys[start:]:
        text = cache.get(key)
        if text is None:
            text = cache[key] = _histogram_text(shape, edges, key)
        slots = exemplars.get(key) if exemplars else None
        total: Number = 0
        for i in range(size):
            total += values[j]
            j += 1
            value = go_.get(total)
            if value is None:
                value = go_[total] = go(total)
            if slots is not None and (found := slots[i]) is not None:
                out.append(f"{text[i]}{value}{show(found)}\n")
            else:
                out.append(f"{text[i]}{value}\n")
        if len(text) > size:
            out.append(f"{text[size]}{value}\n{text[size + 1]}{go(values[j])}\n")
        j += 1


def _no_exemplar(found: Exemplar) -> str:
    return ""


def _samples(frame: Frame, out: list[str], start: int, stop: int) -> None:
    """Append the lines of a counter's or gauge's series ``start`` to ``stop``."""
    shape, keys, values = frame.shape, frame.keys, frame.values
    cache = _lines(shape).samples
    end = len(keys) if stop < 0 else stop
    for key, value in zip(keys[start:end], values[start:end], strict=True):
        text = cache.get(key)
        if text is None:
            labels = zip(shape.labels, key, strict=False)
            text = cache[key] = _prefix(shape.name, dict(labels).items())
        out.append(f"{text}{go(value)}\n")


def head(shape: Shape) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family, as ``generate_latest`` writes them."""
    return _lines(shape).head


def lines_of(
    frames: Iterable[Frame], header: Head, suffix: Suffix | None, lines: int
) -> Iterator[bytes]:
    """Each family with a series, its ``header`` then its series' lines (bucket lines with
    their exemplars when there is a ``suffix``), in parts of about ``lines`` lines: a caller on
    the event loop lets other tasks run between parts."""
    out: list[str] = []
    for frame in frames:
        histogram = frame.shape.type is Type.HISTOGRAM
        step = max(1, lines // (frame.shape.size + 3 if histogram else 1))
        for start in range(0, len(frame.keys), step):
            if start == 0:
                out.append(header(frame.shape))
            if histogram:
                _histogram(frame, out, start, start + step, suffix)
            else:
                _samples(frame, out, start, start + step)
            if len(out) >= lines:
                yield "".join(out).encode()
                out.clear()
    if out:
        yield "".join(out).encode()


def parts(frames: Iterable[Frame], lines: int = 1000) -> Iterator[bytes]:
    """The families in the text format, in parts of about ``lines`` lines."""
    return lines_of(frames, head, None, lines)


def render(frames: Iterable[Frame]) -> bytes:
    """The families in the text format: ``generate_latest`` of their collector."""
    return b"".join(lines_of(frames, head, None, sys.maxsize))
