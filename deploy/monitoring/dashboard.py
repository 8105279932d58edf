"""The Grafana dashboard for the gateway, its engines and its tenants, built with grafana-foundation-sdk.

``python -m deploy.monitoring dashboard`` writes it to deploy/monitoring/modgate-dashboard.json (committed;
a test regenerates it and compares) from the panels of deploy/monitoring/panels.py, where every panel's
PromQL is declared once.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders.common import ReduceDataOptions
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as StatPanel
from grafana_foundation_sdk.builders.timeseries import Panel as TimeseriesPanel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueGraphMode
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
)

from deploy.monitoring.panels import ROWS, PanelSpec, Query

UID = "modgate-overview"
TITLE = "modgate: gateway, engines, tenants"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

def _target(query: Query, ref_id: str) -> Dataquery:
    target = Dataquery().expr(query.expr).ref_id(ref_id).datasource(DATASOURCE)
    return target.legend_format(query.legend) if query.legend else target


def _panel(spec: PanelSpec) -> StatPanel | TimeseriesPanel:
    panel: StatPanel | TimeseriesPanel
    if spec.kind == "stat":
        panel = (
            StatPanel()
            .graph_mode(BigValueGraphMode.AREA)
            .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
        )
    else:
        panel = TimeseriesPanel().fill_opacity(10).line_width(1)
    panel = (
        panel.title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(DATASOURCE)
        .height(4 if spec.kind == "stat" else 8)
        .span(spec.width)
        .min(0)
    )
    if spec.max_value is not None:
        panel = panel.max(spec.max_value)
    if spec.kind == "stat":
        panel = panel.thresholds(
            ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(value=None, color="green")])
        )
    for index, query in enumerate(spec.queries):
        panel = panel.with_target(_target(query, chr(ord("A") + index)))
    return panel


def build_dashboard() -> Dashboard:
    """The dashboard, as grafana-foundation-sdk's builder."""
    dashboard = (
        Dashboard(TITLE)
        .uid(UID)
        .tags(["modgate"])
        .description("modgate's gateway, engines and tenants (docs/telemetry.md; alerts: docs/alerts.md).")
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            QueryVariable("instance")
            .label("Replica")
            .datasource(DataSourceRef(type_val="prometheus", uid="${datasource}"))
            .query("label_values(modgate_requests_total, instance)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    for title, panels in ROWS:
        dashboard = dashboard.with_row(Row(title))
        for spec in panels:
            dashboard = dashboard.with_panel(_panel(spec))
    return dashboard


def dashboard_json() -> str:
    """The dashboard as Grafana imports it (sorted keys, so a regenerated file compares byte for byte)."""
    return json.dumps(build_dashboard().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def panel_queries(document: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (panel title, PromQL) of an exported dashboard document."""
    return [
        (panel["title"], target["expr"])
        for panel in document["panels"]
        for target in panel.get("targets", [])
    ]
