"""Which GPUs the sidecar reports (``collectors.devices``): ``--gpus``, else
CUDA_VISIBLE_DEVICES as CUDA reads it (indices or UUIDs, up to the first invalid entry), else
NVIDIA_VISIBLE_DEVICES as the container runtime does (host indices, already applied inside a
container that sees only those GPUs), else all; and where the choice came from."""

from __future__ import annotations

import pytest

from llmobs.collectors.devices import DeviceSelection


@pytest.mark.parametrize(
    ("gpus", "cuda", "nvidia", "count", "chosen"),
    [
        ((), None, None, 4, [0, 1, 2, 3]),
        ((), "2,GPU-b", None, 4, [1, 2]),  # an index and a UUID prefix
        ((), "0,-1,3", None, 4, [0]),  # CUDA stops at the first invalid entry
        ((), "", None, 4, []),  # CUDA_VISIBLE_DEVICES="" hides every GPU
        (("3",), "0", None, 4, [3]),  # --gpus wins over the environment
        (("all",), "0", None, 4, [0, 1, 2, 3]),
        ((), None, "all", 4, [0, 1, 2, 3]),
        ((), None, "void", 4, []),
        ((), None, "2,3", 4, [2, 3]),  # host indices, NVML sees the whole host
        ((), None, "2,3", 2, [0, 1]),  # in a container: already filtered and renumbered
        ((), "1", "2,3", 2, [1]),  # CUDA's indices are within what the container sees
        ((), " 01 , 3 ", None, 4, [1, 3]),  # spaces and leading zeros, as CUDA reads them
        ((), "1,x,2", None, 4, [1]),
        ((), "-1", None, 4, []),  # the usual way to hide every GPU
        ((), "GPU-c,0", None, 4, [0, 2]),  # a UUID, then an index
        ((), None, " NONE ", 4, []),
        ((), None, "", 4, []),
        ((), None, "GPU-d3", 4, [3]),  # a UUID applies wherever NVML is
        ((), None, "1,GPU-a", 1, [0]),  # one GPU visible for two entries: filtered already
        (("", " 2 "), None, None, 4, [2]),  # blank entries of --gpus are skipped
        (("GPU-b1", "all"), None, None, 4, [0, 1, 2, 3]),  # "all" among them is all
    ],
)
def test_device_selection(
    gpus: tuple[str, ...], cuda: str | None, nvidia: str | None, count: int, chosen: list[int]
) -> None:
    selection = DeviceSelection.of(gpus, cuda, nvidia)
    uuids = ["GPU-a0", "GPU-b1", "GPU-c2", "GPU-d3"][:count]
    assert [i for i, u in enumerate(uuids) if selection.wants(i, u, count)] == chosen


@pytest.mark.parametrize(
    ("gpus", "cuda", "nvidia", "expected"),
    [
        ((), None, None, DeviceSelection(None, "all")),
        ((" 1", "GPU-x "), "0", "2", DeviceSelection(("1", "GPU-x"), "--gpus")),
        ((), " 01,GPU-x,MIG-y,z,3", "2", DeviceSelection(("1", "GPU-x", "MIG-y"),
                                                        "CUDA_VISIBLE_DEVICES")),
        ((), None, "2, GPU-x", DeviceSelection(("2", "GPU-x"), "NVIDIA_VISIBLE_DEVICES", True)),
        ((), None, "void", DeviceSelection((), "NVIDIA_VISIBLE_DEVICES")),
    ],
)  # fmt: skip
def test_the_selection_says_where_it_came_from(
    gpus: tuple[str, ...], cuda: str | None, nvidia: str | None, expected: DeviceSelection
) -> None:
    assert DeviceSelection.of(gpus, cuda, nvidia) == expected


def test_a_uuid_entry_is_a_prefix_and_an_index_is_no_uuid() -> None:
    selection = DeviceSelection(("GPU-ab", "MIG-1", "7"))
    assert selection.wants_uuid("GPU-abcdef") and selection.wants_uuid("MIG-12")
    assert not selection.wants_uuid("GPU-a") and not selection.wants_uuid("GPU-7")
    assert not DeviceSelection(None).wants_uuid("GPU-ab")  # all: no UUID named
    assert not DeviceSelection(()).wants(0, "GPU-ab", 1)  # none: not even one
