"""``python -m deploy.monitoring``: write the dashboard JSON and the PrometheusRule from their sources."""

from __future__ import annotations

from deploy.monitoring.dashboard import dashboard_json
from deploy.monitoring.prometheusrule import DASHBOARD, PROMETHEUS_RULE, prometheus_rule_yaml


def main() -> None:
    """Regenerate both files."""
    DASHBOARD.write_text(dashboard_json())
    PROMETHEUS_RULE.parent.mkdir(parents=True, exist_ok=True)
    PROMETHEUS_RULE.write_text(prometheus_rule_yaml())
    print(f"wrote {DASHBOARD.name} and {PROMETHEUS_RULE.relative_to(PROMETHEUS_RULE.parents[3])}")


if __name__ == "__main__":
    main()
