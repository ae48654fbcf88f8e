"""The panel kinds the rows are made of (time series, stat, heatmap) and their queries, built
with Grafana's grafana-foundation-sdk: typed builders generated from Grafana 11.2's schema, so
that a misspelt option or a wrong enum value fails here, not in Grafana.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import heatmap as heatmap_builders
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.builders import stat as stat_builders
from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models import heatmap as heatmap_models
from grafana_foundation_sdk.models import prometheus as prometheus_models

from panels.promql import rate

Json = dict[str, Any]

DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")


def built(builder: Any) -> Json:
    """A builder's object as the JSON Grafana reads (the SDK's encoder)."""
    out: Json = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return out


def target(
    expr: str, legend: str = "__auto", *, exemplar: bool = False, fmt: str | None = None
) -> Any:
    """A Prometheus query (a builder: ``panel`` gives it its refId)."""
    query = prometheus.Dataquery().expr(expr).legend_format(legend).range()
    query = query.datasource(DATASOURCE)
    if exemplar:
        query = query.exemplar(True)
    if fmt is not None:
        query = query.format(prometheus_models.PromQueryFormat(fmt))
    return query


def thresholds(*steps: tuple[float | None, str]) -> Any:
    """Colour steps from absolute values (``None``: the base colour below the first)."""
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_models.Threshold(value=v, color=c) for v, c in steps])
    )


def panel(
    builder: Any,
    title: str,
    description: str,
    targets: Sequence[Any],
    unit: str = "short",
    width: int = 8,
    height: int = 8,
    **defaults: Any,
) -> Any:
    """The settings every panel has: title, description, data source, queries (refIds A, B,
    ...), unit, size, and the field defaults given (``min``, ``max``, ``decimals``,
    ``thresholds``)."""
    b = builder.title(title).description(description).datasource(DATASOURCE)
    b = b.unit(unit).span(width).height(height)
    for i, query in enumerate(targets):
        b = b.with_target(query.ref_id("ABCDEFGH"[i]))
    for name, value in defaults.items():
        b = getattr(b, name)(value)
    return b


def timeseries(
    title: str,
    description: str,
    targets: Sequence[Any],
    unit: str = "short",
    stack: bool = False,
    width: int = 8,
    **defaults: Any,
) -> Json:
    """Lines over time; stacked and filled when ``stack``; thresholds drawn as lines."""
    b = panel(timeseries_builders.Panel(), title, description, targets, unit, width, **defaults)
    stacking = (
        common_builders.StackingConfig()
        .group("A")
        .mode(common_models.StackingMode.NORMAL if stack else common_models.StackingMode.NONE)
    )
    line = common_models.GraphThresholdsStyleMode
    b = (
        b.draw_style(common_models.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(20 if stack else 0)
        .show_points(common_models.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(stacking)
        .thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(
                line.LINE if "thresholds" in defaults else line.OFF
            )
        )
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common_models.LegendDisplayMode.LIST)
            .placement(common_models.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common_models.TooltipDisplayMode.MULTI)
            .sort(common_models.SortOrder.DESCENDING)
        )
    )
    return built(b)


def stat(title: str, description: str, expr: str, unit: str, steps: Any, **defaults: Any) -> Json:
    """One figure, its background coloured by ``steps``: a glance at the top of a row."""
    b = panel(stat_builders.Panel(), title, description, [target(expr, title)], unit, 4, 4,
              **defaults)  # fmt: skip
    b = (
        b.thresholds(steps)
        .reduce_options(
            common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
        )
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .graph_mode(common_models.BigValueGraphMode.AREA)
        .text_mode(common_models.BigValueTextMode.VALUE)
        .justify_mode(common_models.BigValueJustifyMode.AUTO)
        .orientation(common_models.VizOrientation.AUTO)
    )
    return built(b)


def heatmap(title: str, description: str, histogram: str) -> Json:
    """A classic histogram's buckets over time, with the traced requests' exemplars."""
    expr = f"sum by (le) ({rate(histogram + '_bucket', fn='increase')})"
    heat = target(expr, "{{le}}", fmt="heatmap", exemplar=True)  # exemplars: traces
    b = panel(heatmap_builders.Panel(), title, description, [heat], "s", 12)
    b = (
        b.calculate(False)
        .cell_gap(1)
        .color(
            heatmap_builders.HeatmapColorOptions()
            .mode(heatmap_models.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
            .exponent(0.5)
        )
        .y_axis(
            heatmap_builders.YAxisConfig()
            .axis_placement(common_models.AxisPlacement.LEFT)
            .unit("s")
        )
        .rows_frame(
            heatmap_builders.RowsHeatmapOptions().layout(common_models.HeatmapCellLayout.AUTO)
        )
        .mode(common_models.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_color_scale(True)
        .show_legend()
        .filter_values(heatmap_builders.FilterValueRange().le(1e-9))
        .exemplars_color("rgba(255,0,255,0.7)")
    )
    return built(b)
