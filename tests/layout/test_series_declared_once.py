"""Every Prometheus series of the gateway is declared in one room, ``gateway/series/`` (issue 56).

A module elsewhere that constructs a prometheus_client metric (``Counter``, ``Gauge``, ``Histogram``,
``Summary``, ``Info``, ``Enum``) or a metric family a collector yields at scrape time (``GaugeMetricFamily``,
...) fails here: it would be a series docs/telemetry.md and the dashboard do not know of. Read from the
source's syntax tree, through any alias (``from prometheus_client import Counter as C``, ``import
prometheus_client as pc``).
"""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
SERIES = GATEWAY / "series"
KINDS = frozenset({"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"})


def is_kind(name: str) -> bool:
    """A prometheus_client class whose instances are exposed series."""
    return name in KINDS or name.endswith("MetricFamily")


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def metric_constructions(source: str) -> list[tuple[int, str]]:
    """``(line, kind)`` for each prometheus_client metric or metric family ``source`` constructs."""
    tree = ast.parse(source)
    kinds: dict[str, str] = {}  # a local name -> the prometheus_client class it is
    modules: set[str] = set()  # local names bound to prometheus_client or one of its modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "prometheus_client":
            for alias in node.names:
                if is_kind(alias.name):
                    kinds[alias.asname or alias.name] = alias.name
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "prometheus_client":
                    modules.add(alias.asname or "prometheus_client")
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in kinds:
            found.append((node.lineno, kinds[func.id]))
        elif isinstance(func, ast.Attribute) and is_kind(func.attr) and _root(func.value) in modules:
            found.append((node.lineno, func.attr))
    return found


def test_no_module_outside_gateway_series_constructs_a_metric() -> None:
    elsewhere = {
        str(path.relative_to(GATEWAY.parent)): found
        for path in sorted(GATEWAY.rglob("*.py"))
        if SERIES not in path.parents and (found := metric_constructions(path.read_text()))
    }

    assert elsewhere == {}, "declare these in gateway/series/ (and document them in docs/telemetry.md)"


def test_the_scanner_finds_the_gateways_declarations_in_gateway_series() -> None:
    found = [kind for path in SERIES.rglob("*.py") for _, kind in metric_constructions(path.read_text())]

    assert len(found) > 50  # the gateway's series (a few through a helper), the scrape-time ones included
    assert {"Counter", "Gauge", "Histogram", "GaugeMetricFamily", "CounterMetricFamily"} <= set(found)


def test_a_planted_declaration_is_caught_through_any_alias() -> None:
    pool_build = (GATEWAY / "engine" / "pool_build.py").read_text()
    lines = len(pool_build.splitlines())
    planted = pool_build + (
        "\nfrom prometheus_client import Counter as Tally\n"
        "import prometheus_client as prom\n"
        "from prometheus_client import core\n"
        "LATE = Tally('modgate_late', 'A series declared out of place.')\n"
        "def scraped() -> object:\n"
        "    yield prom.Summary('modgate_later', 'Another.')\n"
        "    yield core.GaugeMetricFamily('modgate_scraped', 'At scrape time.', value=1.0)\n"
    )

    assert metric_constructions(pool_build) == []
    assert sorted(metric_constructions(planted)) == [
        (lines + 5, "Counter"), (lines + 7, "Summary"), (lines + 8, "GaugeMetricFamily"),
    ]


def test_reading_and_exposing_metrics_is_not_declaring_them() -> None:
    source = (
        "from prometheus_client import CollectorRegistry, Counter, generate_latest\n"
        "from prometheus_client.parser import text_string_to_metric_families\n"
        "def read(counter: Counter, registry: CollectorRegistry) -> bytes:\n"
        "    counter.inc()\n"
        "    list(text_string_to_metric_families('x 1'))\n"
        "    return generate_latest(registry)\n"
    )

    assert metric_constructions(source) == []
