"""The dashboard's variables: the data source, the pods chosen (namespace, job, pod: "All" by
default, so one pod, one job's or the fleet, summed as Prometheus sums them), the models, and
the window the SLO panels measure over.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.models import dashboard as dashboard_models

from panels.builders import DATASOURCE
from panels.names import ACTIVE, REQUESTS
from panels.promql import POD


def variable(name: str, label: str, query: str) -> Any:
    """A multi-value query variable over a label, "All" by default."""
    every = dashboard_models.VariableOption(selected=True, text=["All"], value=["$__all"])
    return (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": "StandardVariableQuery"})
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .current(every)
        .options([])
        .regex("")
        .sort(dashboard_models.VariableSort.ALPHABETICAL_ASC)
        .hide(dashboard_models.VariableHide.DONT_HIDE)
    )


def window_variable() -> Any:
    """The range the SLO panels measure attainment and budget over (a Prometheus range)."""
    options = ["1h", "1d", "7d", "28d", "30d"]
    return (
        dashboard_builders.CustomVariable("slo_window")
        .label("SLO window")
        .values(",".join(options))
        .current(dashboard_models.VariableOption(selected=True, text="28d", value="28d"))
        .options(
            [dashboard_models.VariableOption(selected=o == "28d", text=o, value=o) for o in options]
        )
        .include_all(False)
        .multi(False)
        .hide(dashboard_models.VariableHide.DONT_HIDE)
    )


def datasource_variable() -> Any:
    """The Prometheus to query, chosen on the dashboard: no data source written into it."""
    return (
        dashboard_builders.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .current(dashboard_models.VariableOption(text="", value=""))
        .regex("")
        .hide(dashboard_models.VariableHide.DONT_HIDE)
    )


def variables() -> list[Any]:
    """Every variable, in the order the dashboard shows them."""
    return [
        datasource_variable(),
        variable("namespace", "Namespace", f"label_values({ACTIVE}, namespace)"),
        variable("job", "Job", f'label_values({ACTIVE}{{namespace=~"$namespace"}}, job)'),
        variable(
            "pod",
            "Pod",
            f'label_values({ACTIVE}{{namespace=~"$namespace", job=~"$job"}}, pod)',
        ),
        variable("model", "Model", f"label_values({REQUESTS}{{{POD}}}, gen_ai_request_model)"),
        window_variable(),
    ]
