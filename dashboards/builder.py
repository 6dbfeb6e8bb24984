"""Turns a :class:`~boards.model.Board` into Grafana dashboard JSON with
grafana-foundation-sdk's builders: panels laid out left to right in rows of 24 columns,
ids in table order (explain's links name them: exporter/explain/checks/ ``CAUSES``), the
datasource/cluster/node variables and the link to the other fabricscope dashboards."""

from __future__ import annotations

import json

from boards.model import Board, Panel
from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, table, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as prom_m

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def _target(expr: str, legend: str, ref: str, kind: str) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if kind in ("matrix", "table"):  # one frame of rows, pivoted or listed
        q = q.instant().format(prom_m.PromQueryFormat.TABLE)
    elif kind == "bargauge":  # a series per bar, each with its labels (for its data link)
        q = q.instant()
    return q


#: where a series naming a node leads: that node's dashboard, same time range and cluster
NODE_LINK = (
    "/d/fabricscope-node/fabricscope-node?var-node=${__field.labels.instance}"
    "&${cluster:queryparam}&${datasource:queryparam}&${__url_time_range}"
)


def _node_link() -> dashboard.DashboardLink:
    return (
        dashboard.DashboardLink("Node dashboard: ${__field.labels.instance}")
        .type(dm.DashboardLinkType.LINK)
        .url(NODE_LINK)
    )


def _panel(p: Panel, pid: int, x: int, y: int) -> object:
    if p.kind == "timeseries":
        b = (
            timeseries.Panel()
            .line_width(1)
            .fill_opacity(10 if not p.stack else 60)
            .show_points(common.VisibilityMode.NEVER)
            .legend(
                common_b.VizLegendOptions()
                .show_legend(True)
                .display_mode(common.LegendDisplayMode.TABLE)
                .placement(common.LegendPlacement.RIGHT)
                .calcs(["max", "lastNotNull"])
                .sort_by("Max")
                .sort_desc(True)
            )
        )
    elif p.kind == "bargauge":
        b = (
            bargauge.Panel()
            .display_mode(common.BarGaugeDisplayMode.BASIC)
            .orientation(common.VizOrientation.HORIZONTAL)
            .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        )
    else:  # matrix: a table pivoted to rows x columns, cells coloured by value
        b = (
            table.Panel()
            .cell_options(
                common.TableColoredBackgroundCellOptions(
                    mode=common.TableCellBackgroundDisplayMode.GRADIENT
                )
            )
            .with_transformation(
                dm.DataTransformerConfig(
                    id_val="groupingToMatrix",
                    options={
                        "rowField": p.matrix[0],
                        "columnField": p.matrix[1],
                        "valueField": "Value",
                    },
                )
            )
            .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.CONTINUOUS_RD_YL_GR))
        )
    b = (
        b.id(pid)
        .title(p.title)
        .description(p.description)
        .datasource(DS)
        .unit(p.unit)
        .grid_pos(dm.GridPos(h=p.h, w=p.w, x=x, y=y))
    )
    for i, (expr, legend) in enumerate(p.targets):
        b = b.with_target(_target(expr, legend, chr(ord("A") + i), p.kind))
    if p.link:
        b = b.data_links(
            [dashboard.DashboardLink("Open").type(dm.DashboardLinkType.LINK).url(p.link)]
        )
    elif p.node_link and any("{{instance}}" in legend for _, legend in p.targets):
        b = b.data_links([_node_link()])
    return b


def _variables(board: Board) -> list[object]:
    out: list[object] = [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    ]
    cluster = (
        dashboard.QueryVariable("cluster")
        .label("Cluster")
        .datasource(DS)
        .query("label_values(fabricscope_build_info, cluster)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .all_value(".*")
        .multi(True)
    )
    node = (
        dashboard.QueryVariable("node")
        .label("Node")
        .datasource(DS)
        .query('label_values(fabricscope_build_info{cluster=~"$cluster"}, instance)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )
    if not board.single_node:
        node = node.include_all(True).all_value(".*").multi(True)
    out += [cluster, node]
    for name, query in board.extra_vars:
        out.append(
            dashboard.QueryVariable(name)
            .label(name.capitalize())
            .datasource(DS)
            .query(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True)
            .all_value(".*")
        )
    return out


def build(board: Board) -> dict[str, object]:
    d = (
        dashboard.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags(["fabricscope"])
        .editable()
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard.DashboardLink("Fabricscope")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["fabricscope"])
            .as_dropdown(False)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for v in _variables(board):
        d = d.with_variable(v)  # type: ignore[arg-type]
    x = y = row_h = 0
    for pid, p in enumerate(board.panels, start=1):
        if x + p.w > 24 or (p.new_row and x):
            x, y, row_h = 0, y + row_h, 0
        d = d.with_panel(_panel(p, pid, x, y))  # type: ignore[arg-type]
        x += p.w
        row_h = max(row_h, p.h)
    out: dict[str, object] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def render(board: Board) -> str:
    return json.dumps(build(board), indent=2, sort_keys=True) + "\n"
