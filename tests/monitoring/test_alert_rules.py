"""deploy/monitoring/modgate-rules.yaml with the real promtool: it checks, its unit tests pass, every alert
has a scenario that fires it and one that keeps it quiet, a summary, a severity and a runbook section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from deploy.monitoring.prometheusrule import MONITORING, PROMETHEUS_RULE, RULES, prometheus_rule_yaml
from tests.monitoring.promql import alerts, rules, run_promtool

RULE_TESTS = sorted(MONITORING.glob("*.test.yaml"))
ALERTS_DOC = MONITORING.parents[1] / "docs" / "alerts.md"
SEVERITIES = {"critical", "warning", "info"}


def test_promtool_checks_the_rules_file() -> None:
    result = run_promtool("check", "rules", RULES)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_refuses_a_rule_whose_expression_does_not_parse(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "g",
                        "rules": [
                            {"alert": "Broken", "expr": "sum(rate(modgate_requests_total[5m]) > 1"},
                        ],
                    }
                ]
            }
        )
    )

    result = run_promtool("check", "rules", broken)

    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


@pytest.mark.parametrize("tests", RULE_TESTS, ids=lambda path: path.name)
def test_promtool_unit_tests_of_the_rules_pass(tests: Path) -> None:
    result = run_promtool("test", "rules", tests.name, cwd=tests.parent)

    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails_promtool_test_rules(tmp_path: Path) -> None:
    (tmp_path / "modgate-rules.yaml").write_text(RULES.read_text())
    (tmp_path / "wrong.test.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["modgate-rules.yaml"],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [
                            {"series": 'modgate_engine_leases_local_only{instance="gw-a"}', "values": "0x5"}
                        ],
                        "alert_rule_test": [
                            {
                                "eval_time": "5m",
                                "alertname": "ModgateRedisUnreachable",
                                "exp_alerts": [{"exp_labels": {"severity": "critical", "instance": "gw-a"}}],
                            }
                        ],
                    }
                ],
            }
        )
    )

    result = run_promtool("test", "rules", "wrong.test.yaml", cwd=tmp_path)

    assert result.returncode != 0
    assert "ModgateRedisUnreachable" in result.stdout + result.stderr


def scenarios() -> tuple[set[str], set[str]]:
    """Alert names some promtool test expects firing, and those some test expects quiet."""
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    return firing, quiet


@pytest.mark.parametrize("alert", [rule["alert"] for rule in alerts()])
def test_every_alert_has_a_scenario_that_fires_it_and_one_that_keeps_it_quiet(alert: str) -> None:
    firing, quiet = scenarios()

    assert alert in firing
    assert alert in quiet


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces as dashes)."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("alert", alerts(), ids=lambda rule: rule["alert"])
def test_every_alert_has_a_summary_a_severity_and_a_runbook_section(alert: dict[str, object]) -> None:
    annotations = alert["annotations"]
    labels = alert["labels"]
    assert isinstance(annotations, dict)
    assert isinstance(labels, dict)
    page, _, anchor = annotations["runbook_url"].partition("#")

    assert annotations["summary"]
    assert labels["severity"] in SEVERITIES
    assert page == "docs/alerts.md"
    assert anchor == str(alert["alert"]).lower()
    assert anchor in anchors(ALERTS_DOC.read_text())


def test_the_kubernetes_prometheusrule_is_the_rules_file_regenerated() -> None:
    assert PROMETHEUS_RULE.read_text() == prometheus_rule_yaml(), "run: python -m deploy.monitoring"
    assert (
        yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]["groups"]
        == (yaml.safe_load(RULES.read_text())["groups"])
    )
