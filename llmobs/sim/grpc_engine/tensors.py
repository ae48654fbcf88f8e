"""Triton's tensors as a ModelInferRequest carries them and a response returns them.

An input's elements come in ``raw_input_contents`` (one entry per input, as tritonclient sends
them by default) or in the tensor's typed ``contents``; a BYTES tensor's raw form is each
element as a 4-byte little-endian length and its bytes. The ensemble reads a batch of one:
the first element of each input.
"""

from __future__ import annotations

import struct
from typing import Any

from llmobs.sim.dialects.base import BadRequest

# an integer datatype: its raw element's struct format and the typed contents' field
_INTEGERS = {
    "INT32": ("<i", "int_contents"),
    "INT64": ("<q", "int64_contents"),
    "UINT32": ("<I", "uint_contents"),
    "UINT64": ("<Q", "uint64_contents"),
}


def split_bytes(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements from its raw form."""
    items: list[bytes] = []
    at = 0
    while at < len(raw):
        size = struct.unpack_from("<I", raw, at)[0] if at + 4 <= len(raw) else None
        at += 4
        if size is None or at + size > len(raw):
            raise BadRequest("a BYTES tensor's raw contents are cut short")
        items.append(raw[at : at + size])
        at += size
    return items


def bytes_tensor(text: str) -> bytes:
    """One string as a BYTES tensor's raw contents."""
    data = text.encode()
    return struct.pack("<I", len(data)) + data


def int32_tensor(value: int) -> bytes:
    """One INT32 element as a tensor's raw contents."""
    return struct.pack("<i", value)


class Inputs:
    """A request's input tensors by name, each read as its first element (None: absent)."""

    def __init__(self, request: Any) -> None:
        raw = list(request.raw_input_contents)
        if raw and len(raw) != len(request.inputs):
            raise BadRequest("raw_input_contents must hold one entry per input")
        self._tensors = {t.name: (t, raw[i] if raw else None) for i, t in enumerate(request.inputs)}

    def _tensor(self, name: str, kinds: str) -> tuple[Any, bytes | None] | None:
        found = self._tensors.get(name)
        if found is not None and found[0].datatype not in kinds.split():
            raise BadRequest(f"'{name}' must be a tensor of {kinds.replace(' ', ' or ')}")
        return found

    def text(self, name: str) -> str | None:
        found = self._tensor(name, "BYTES")
        if found is None:
            return None
        tensor, raw = found
        items = split_bytes(raw) if raw is not None else list(tensor.contents.bytes_contents)
        if not items:
            raise BadRequest(f"'{name}' has no element")
        try:
            return items[0].decode()
        except UnicodeDecodeError:
            raise BadRequest(f"'{name}' is not UTF-8 text") from None

    def integer(self, name: str) -> int | None:
        found = self._tensor(name, " ".join(_INTEGERS))
        if found is None:
            return None
        tensor, raw = found
        form, field = _INTEGERS[tensor.datatype]
        if raw is not None:
            if len(raw) < struct.calcsize(form):
                raise BadRequest(f"'{name}' has no element")
            return int(struct.unpack_from(form, raw)[0])
        values = getattr(tensor.contents, field)
        if not values:
            raise BadRequest(f"'{name}' has no element")
        return int(values[0])

    def flag(self, name: str) -> bool | None:
        found = self._tensor(name, "BOOL")
        if found is None:
            return None
        tensor, raw = found
        values = list(raw) if raw is not None else list(tensor.contents.bool_contents)
        if not values:
            raise BadRequest(f"'{name}' has no element")
        return bool(values[0])
