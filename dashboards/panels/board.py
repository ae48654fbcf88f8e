"""The dashboard assembled: its rows in order, laid out on Grafana's grid, its variables,
links and annotations, and the two things of an export that stay outside the SDK's schema
(the ``__requires`` header and a query variable's ``definition``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.models import dashboard as dashboard_models

from panels.builders import Json, built
from panels.disagg import disagg_row
from panels.errors import errors_row
from panels.experience import distribution_row, experience_row
from panels.gpu import gpu_row
from panels.health import health_row
from panels.load import load_row
from panels.overview import overview_row, worst_pods
from panels.saturation import saturation_row
from panels.slo import slo_row
from panels.tenants import tenants_row
from panels.variables import variables
from panels.why import why_row


def row(title: str) -> Json:
    """A row's header: the title above its panels, never collapsed."""
    return built(dashboard_builders.Row(title).collapsed(False))


def layout(rows: Sequence[tuple[str, list[Json]]]) -> list[Json]:
    """Ids and grid positions, left to right, wrapping at Grafana's 24 columns."""
    out: list[Json] = []
    y = 0
    for title, panels in rows:
        header = row(title)
        header["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
        out.append(header)
        y += 1
        x = line_h = 0
        for p in panels:
            w, h = p["gridPos"]["w"], p["gridPos"]["h"]
            if x + w > 24:
                y, x, line_h = y + line_h, 0, 0
            p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            x, line_h = x + w, max(line_h, h)
            out.append(p)
        y += line_h
    for i, p in enumerate(out, start=1):
        p["id"] = i
    return out


def rows() -> list[tuple[str, list[Json]]]:
    """Each row's title and panels, top to bottom."""
    return [
        ("Overview", [*overview_row(), worst_pods()]),
        ("Service-level objectives", slo_row()),
        ("User experience", experience_row()),
        ("Why it was slow", why_row()),
        ("One request, two pods (disaggregated prefill and decode)", disagg_row()),
        ("Saturation (what an autoscaler reads)", saturation_row()),
        ("Who it was slow for, and what it cost", tenants_row()),
        ("Load", load_row()),
        ("Errors and outcomes", errors_row()),
        ("Distributions", distribution_row()),
        ("GPU", gpu_row()),
        ("Sidecar health", health_row()),
    ]


def dashboard() -> Json:
    """The dashboard as Grafana imports it: the SDK's, then what an export adds to it."""
    runbook = (
        dashboard_builders.DashboardLink("Runbook")
        .type(dashboard_models.DashboardLinkType.LINK)
        .url("https://github.com/llmobs/llmobs/blob/main/docs/runbook.md")
        .target_blank(True)
        .icon("doc")
    )
    alerts = (
        dashboard_builders.AnnotationQuery()
        .name("Annotations & Alerts")
        .datasource(dashboard_models.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .type("dashboard")
        .built_in(1)
    )
    board = (
        dashboard_builders.Dashboard("llmobs: LLM serving")
        .uid("llmobs")
        .description(
            "What users of an LLM inference server feel, measured by the llmobs sidecar: TTFT, "
            "inter-token latency, stutter, queue, errors, GPU and MBU."
        )
        .tags(["llmobs", "llm", "gen-ai", "inference"])
        .timezone("browser")
        .editable()
        .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .fiscal_year_start_month(0)
        .live_now(False)
        .week_start("")
        .version(1)
        .link(runbook)
        .annotation(alerts)
    )
    for each in variables():
        board = board.with_variable(each)
    out = built(board)
    for found in out["templating"]["list"]:  # the query as Grafana's editor shows it: outside
        if found["type"] == "query":  # the schema, written by every Grafana export
            found["definition"] = found["query"]["query"]
    out["panels"] = layout(rows())
    # an export's header: what importing it in Grafana's UI asks for (no part of the schema)
    requires = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    ]
    return {"__requires": requires, "id": None, **out}


def render() -> str:
    """The dashboard's JSON as committed: indented, non-ASCII kept, one final newline."""
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"
