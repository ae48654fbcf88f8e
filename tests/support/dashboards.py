"""The Grafana dashboard as the tests read it: its panels and queries, Grafana's variables
substituted, label_values() answered from a Prometheus; and the sidecar setup (fake GPUs, a
model shape) under which every panel has something to show."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tests.support.fake_nvml import GIB, FakeGpu
from tests.support.prom import ROOT, Prometheus
from tests.support.promql import variable_selector

DASHBOARD = ROOT / "dashboards" / "llmobs.json"
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval for a 1 s scrape would be 4 s; leave room

Json = dict[str, Any]


def load() -> Json:
    data: Json = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: Json) -> Iterator[Json]:
    """Every panel, those inside collapsed rows included."""
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def queries(dashboard: Json) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every variable's selector."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", t["expr"]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            selector, _ = variable_selector(v["query"]["query"])
            if selector is not None:
                yield f"variable {v['name']!r}", selector


def substitute(expr: str, values: dict[str, str], rate_interval: str = RATE_INTERVAL) -> str:
    """``expr`` with Grafana's variables set to ``values`` (and ``$__rate_interval``)."""
    out = expr.replace("$__rate_interval", rate_interval)
    for name, value in values.items():
        out = out.replace(f"${name}", value)
    assert "$" not in out.replace('"$1"', ""), out
    return out


# Two GPUs seen through a fake NVML: one with GPM (source="gpm"), one without (the
# memory-controller fallback, source="mem_util"); and Llama-3-8B's shape in bf16 with the H100's
# dense peak, so that MBU and MFU are computed from the sidecar's own TPOT and TTFT.
GPUS = [
    FakeGpu("GPU-dash-0", gpm=True, dram_bw_util=42.0),
    FakeGpu("GPU-dash-1", name="NVIDIA A100-SXM4-80GB", used=70 * GIB, max_mem_clock_mhz=1593.0),
]
MODEL_SHAPE: dict[str, Any] = {
    "model_params": 8e9, "weight_dtype": "bf16", "model_layers": 32, "model_kv_heads": 8,
    "model_head_dim": 128, "gpu_peak_flops": 989e12,
}  # fmt: skip


async def label_values(prom: Prometheus, query: str) -> list[str]:
    """What Grafana's label_values(selector, label) offers, through /api/v1/series."""
    selector, label = variable_selector(query)
    assert selector is not None
    found = {s[label] for s in await prom.series(selector) if label in s}
    return sorted(found)
