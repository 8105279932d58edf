"""modgate-rules.yaml as a Prometheus Operator ``PrometheusRule`` for deploy/k8s/overlays/monitoring.

The rules file is the one source; the PrometheusRule carries its groups unchanged, so promtool's tests of the
file hold for the cluster's copy too (a test regenerates it and compares).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).resolve().parent
RULES = MONITORING / "modgate-rules.yaml"
DASHBOARD = MONITORING / "modgate-dashboard.json"
PROMETHEUS_RULE = MONITORING.parent / "k8s" / "overlays" / "monitoring" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/monitoring/modgate-rules.yaml by `python -m deploy.monitoring`: edit that file, then
# regenerate (tests/deploy/test_monitoring_rules.py fails while the two differ).
# The label `release` is what a kube-prometheus-stack Prometheus selects rules by by default; change it to
# your Prometheus's ruleSelector.
"""


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule object holding ``rules``'s groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "modgate",
            "labels": {"app.kubernetes.io/name": "modgate", "release": "prometheus"},
        },
        "spec": {"groups": rules["groups"]},
    }


def prometheus_rule_yaml() -> str:
    """The generated file's text."""
    rules = yaml.safe_load(RULES.read_text())
    body = yaml.safe_dump(prometheus_rule(rules), sort_keys=False, width=110, allow_unicode=True)
    return HEADER + body
