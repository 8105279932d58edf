"""What an operator watches: Prometheus rules (modgate-rules.yaml, promtool-tested) and a Grafana dashboard.

``python -m deploy.monitoring`` regenerates the two derived files: the dashboard JSON (from
:mod:`deploy.monitoring.dashboard`) and the Kubernetes PrometheusRule (from modgate-rules.yaml).
"""
