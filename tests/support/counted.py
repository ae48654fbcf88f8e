"""What a sidecar counted, request by request, to compare two sidecars that carried the same
requests over different transports (HTTP/1.1, TLS, HTTP/2)."""

from __future__ import annotations

from tests.support.servers import SidecarHandle


def counted(side: SidecarHandle) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What the sidecar counted, by series: every counter and every histogram's count, but
    neither the times (they differ run to run: the prefill's busy seconds too) nor the ITL
    samples and stalls, whose number follows how the chunks were read (two that came in one
    read are one sample: TLS records cut a stream differently), nor the TLS families."""
    out = {}
    skip = (
        "llmobs_tls",
        "process",
        "python",
        "llmobs_inter_token",
        "llmobs_stalls",
        "llmobs_prefill_busy",
    )
    for family in side.registry.collect():
        if family.name.startswith(skip):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_total", "_count")) and "_created" not in sample.name:
                out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out
