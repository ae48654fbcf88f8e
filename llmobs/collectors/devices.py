"""Which GPUs the sidecar reports: ``--gpus``, else CUDA's, else the container runtime's choice.

The variables are read by ``llmobs.config.settings`` (the only reader of the environment) and passed
in; this module only interprets them, as CUDA and the NVIDIA container runtime do (docs/gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass

_NO_GPU = ("", "none", "void")


def _cuda_entries(text: str) -> tuple[str, ...]:
    """CUDA's reading of CUDA_VISIBLE_DEVICES: indices or UUIDs, up to the first invalid one."""
    out: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if entry.startswith(("GPU-", "MIG-")):
            out.append(entry)
            continue
        if not entry.isdigit():  # also "-1": CUDA stops at the first invalid entry
            break
        out.append(str(int(entry)))
    return tuple(out)


@dataclass(frozen=True)
class DeviceSelection:
    """Which GPUs to report: ``entries`` are NVML indices or UUID prefixes; None = all.

    ``host_indices`` (NVIDIA_VISIBLE_DEVICES): the indices are the host's; inside a container
    the NVIDIA runtime already shows only those GPUs, renumbered from 0, so the index entries
    are applied only when NVML sees more GPUs than they name.
    """

    entries: tuple[str, ...] | None = None
    source: str = "all"
    host_indices: bool = False

    @classmethod
    def of(
        cls, gpus: tuple[str, ...], cuda_visible: str | None, nvidia_visible: str | None
    ) -> DeviceSelection:
        if gpus:
            entries = tuple(e.strip() for e in gpus if e.strip())
            return cls(None if "all" in entries else entries, "--gpus")
        if cuda_visible is not None:
            return cls(_cuda_entries(cuda_visible), "CUDA_VISIBLE_DEVICES")
        if nvidia_visible is not None:
            text = nvidia_visible.strip().lower()
            if text == "all":
                return cls(None, "NVIDIA_VISIBLE_DEVICES")
            if text in _NO_GPU:
                return cls((), "NVIDIA_VISIBLE_DEVICES")
            entries = tuple(e.strip() for e in nvidia_visible.split(",") if e.strip())
            return cls(entries, "NVIDIA_VISIBLE_DEVICES", host_indices=True)
        return cls()

    def wants(self, index: int, uuid: str, count: int) -> bool:
        """Is the GPU at NVML ``index`` (of ``count``) selected, as a whole?"""
        if self.entries is None:
            return True
        indices = [e for e in self.entries if e.isdigit()]
        if self.host_indices and indices and count <= len(indices):
            return True  # the container runtime has filtered already
        return str(index) in indices or self.wants_uuid(uuid)

    def wants_uuid(self, uuid: str) -> bool:
        return any(not e.isdigit() and uuid.startswith(e) for e in self.entries or ())
