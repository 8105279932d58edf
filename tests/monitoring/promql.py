"""What the monitoring tests share: the real promtool, the rules and dashboard's PromQL, the names in it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.monitoring.dashboard import panel_queries
from deploy.monitoring.prometheusrule import DASHBOARD, RULES

# PromQL words that are not metric names (operators, modifiers); functions are told by their "(".
KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
    }
)
# Series Prometheus itself writes for every target: a rule may name them, no /metrics has them.
SCRAPE_SERIES = frozenset({"up"})


def promtool() -> str:
    """promtool on PATH (Debian's `prometheus` package; scripts/test installs it)."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: scripts/test installs it (apt-get install -y prometheus)")
    return found


def run_promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """promtool with ``args``; its output in the result (the caller checks the exit code)."""
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=240, check=False, cwd=cwd
    )


def rules() -> list[dict[str, Any]]:
    """Every rule of deploy/monitoring/modgate-rules.yaml (recording and alerting)."""
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    """The alerting rules."""
    return [rule for rule in rules() if "alert" in rule]


def dashboard_document() -> dict[str, Any]:
    """The committed dashboard JSON."""
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def dashboard_queries() -> list[tuple[str, str]]:
    """Every (panel title, PromQL) of the committed dashboard."""
    return panel_queries(dashboard_document())


def as_grafana_sends(expr: str) -> str:
    """The query as Grafana sends it with every replica selected (``$instance`` is ``.*``)."""
    return expr.replace("$instance", ".*")


def names_in(expr: str) -> set[str]:
    """The metric (and recording rule) names one PromQL expression reads.

    Strings, label matchers, range and grouping clauses are removed first; what is left that looks like a
    name and is not a function call, a keyword or a number is a series name.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    found = set()
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        found.add(name)
    return found


def exposed(sample_name: str, families: dict[str, str]) -> bool:
    """Whether ``/metrics`` has ``sample_name``: ``families`` maps each ``# TYPE`` line's name to its type
    (prometheus_client names a counter's family ``x_total``; a histogram's samples are ``x_bucket``, …)."""
    if sample_name in families:
        return True
    for suffix in ("_bucket", "_count", "_sum"):
        base = sample_name.removesuffix(suffix)
        if base != sample_name and families.get(base) in {"histogram", "summary"}:
            return True
    return False


def families_in(text: str) -> dict[str, str]:
    """``# TYPE name type`` of a Prometheus text exposition."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))
