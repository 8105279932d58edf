"""deploy/monitoring/modgate-dashboard.json: what the generator writes, every panel's PromQL parsed by the
real promtool, and the rows an operator looks for."""

from __future__ import annotations

from pathlib import Path

import yaml

from deploy.monitoring.dashboard import dashboard_json
from deploy.monitoring.panels import ROWS
from deploy.monitoring.prometheusrule import DASHBOARD
from tests.monitoring.promql import (
    as_grafana_sends,
    dashboard_document,
    dashboard_queries,
    names_in,
    rules,
    run_promtool,
)


def test_the_committed_dashboard_is_what_the_generator_writes() -> None:
    assert DASHBOARD.read_text() == dashboard_json(), "run: python -m deploy.monitoring"


def test_every_panel_query_parses_in_promtool(tmp_path: Path) -> None:
    queries = dashboard_queries()
    throwaway = tmp_path / "panels.yaml"
    throwaway.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "panels",
                        "rules": [
                            {"record": f"panel:query:{index}", "expr": as_grafana_sends(expr)}
                            for index, (_, expr) in enumerate(queries)
                        ],
                    }
                ]
            }
        )
    )

    result = run_promtool("check", "rules", throwaway)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_a_panel_query_that_does_not_parse_is_caught_the_same_way(tmp_path: Path) -> None:
    throwaway = tmp_path / "panels.yaml"
    throwaway.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "panels",
                        "rules": [
                            {
                                "record": "panel:query:0",
                                "expr": "histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m]))",
                            },
                        ],
                    }
                ]
            }
        )
    )

    assert run_promtool("check", "rules", throwaway).returncode != 0


def test_the_dashboard_has_the_rows_an_operator_looks_for() -> None:
    rows = [panel["title"] for panel in dashboard_document()["panels"] if panel["type"] == "row"]

    assert rows == [title for title, _ in ROWS]
    assert {
        "Latency",
        "Queue and slots",
        "Thinking and escalations",
        "Cache and reuse",
        "Errors",
        "Tenants",
    } <= set(rows)


def test_every_panel_has_a_unit_a_description_and_the_replica_selector() -> None:
    panels = [panel for panel in dashboard_document()["panels"] if panel["type"] != "row"]

    assert panels
    for panel in panels:
        assert panel["description"], panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        for target in panel["targets"]:
            names = names_in(target["expr"])
            raw = names - {name for name in names if ":" in name}
            assert not raw or 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


def test_recording_rules_a_panel_reads_are_defined_in_the_rules_file() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    read = {name for _, expr in dashboard_queries() for name in names_in(expr) if ":" in name}

    assert read
    assert read <= recorded


def test_the_panels_do_not_overlap_on_grafanas_24_column_grid() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard_document()["panels"]:
        grid = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert not cells & taken, panel["title"]
        taken |= cells


def test_the_name_extractor_finds_series_and_skips_functions_labels_and_keywords() -> None:
    expr = (
        'sum by (outcome) (rate(modgate_requests_total{outcome=~"engine_.*|x"}[5m])) / ignoring (outcome) '
        "group_left sum(rate(modgate_requests_total[5m])) > 0.02 and on (instance) "
        "modgate:request_slo_misses:ratio_rate1h > 14.4 * 0.01 or vector(0)"
    )

    assert names_in(expr) == {"modgate_requests_total", "modgate:request_slo_misses:ratio_rate1h"}
