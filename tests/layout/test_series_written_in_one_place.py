"""Every series is written in one place (issue 56), as tests/layout/test_series_declared_once.py holds that
each is declared in one.

Who may write a series (``.inc``, ``.dec``, ``.observe``, ``.set``, ``.labels``, ``.set_function``):

- gateway/telemetry/recorder.py: a request's figures and a job's (``RequestRecorder``, ``VerdictRecorder``);
- gateway/engine/calls.py: the engine calls' (``CountedTransport``, ``CallFigures``);
- gateway/series/: the named methods the rooms below telemetry call (the review queue, the decision log, the
  prefix keeper) and the gauges read at scrape time.

Anywhere else a write is a figure docs/telemetry.md's owners do not know of. A metric is told apart by how
it is reached, read from the source's syntax tree: through a name or attribute called ``metrics`` or
``series``, or one named after a series of ``GatewayMetrics`` or ``ReviewMetrics`` (``escalations``,
``_unlogged``: the end of ``decisions_unlogged``), or annotated as a prometheus_client metric, or a local
name bound to any of these.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.layout.test_series_declared_once import KINDS

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
SERIES = GATEWAY / "series"
ALLOWED = frozenset({GATEWAY / "telemetry" / "recorder.py", GATEWAY / "engine" / "calls.py"})
WRITES = frozenset({"inc", "dec", "observe", "set", "labels", "set_function"})
HOLDERS = frozenset({"metrics", "series"})


def series_fields() -> frozenset[str]:
    """The attributes ``GatewayMetrics`` and ``ReviewMetrics`` set in their ``__init__`` (their series)."""
    fields: set[str] = set()
    for name, cls in (("metrics.py", "GatewayMetrics"), ("review.py", "ReviewMetrics")):
        tree = ast.parse((SERIES / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                        fields.add(inner.attr)
    fields.discard("registry")
    return frozenset(fields)


FIELDS = series_fields()


def _named(name: str, aliases: set[str]) -> bool:
    bare = name.lstrip("_")
    return (
        name in aliases or bare in HOLDERS or bare in FIELDS
        or any(field.endswith(f"_{bare}") for field in FIELDS)
    )


def _chain(node: ast.expr) -> list[str]:
    """The names an expression is reached through: ``self.metrics.frames.labels(x)`` gives labels, frames,
    metrics, self (a call's arguments are not on its chain)."""
    names = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            names.append(node.id)
            return names
        else:
            return names


def _metric_like(node: ast.expr, aliases: set[str]) -> bool:
    return any(_named(name, aliases) for name in _chain(node))


def _annotated_metric(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        isinstance(inner, ast.Name | ast.Attribute)
        and (inner.id if isinstance(inner, ast.Name) else inner.attr) in KINDS
        for inner in ast.walk(annotation)
    )


def _aliases(tree: ast.Module) -> set[str]:
    """Names (and ``self.`` attributes) bound to a metric: annotated as one, or assigned one."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and _annotated_metric(node.annotation):
            aliases.add(node.arg if isinstance(node, ast.arg) else _chain(node.target)[0])
    for _ in range(3):  # an alias of an alias
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs: list[tuple[ast.expr, ast.expr]] = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                for bound, value in pairs:
                    names = _chain(bound)
                    if names and _metric_like(value, aliases):
                        aliases.add(names[0])
    return aliases


def series_writes(source: str) -> list[tuple[int, str]]:
    """``(line, method)`` for each write of a metric in ``source``."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    return sorted(
        (node.lineno, node.func.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in WRITES
        and _metric_like(node.func.value, aliases)
    )


def allowed(path: Path) -> bool:
    return path in ALLOWED or SERIES in path.parents


def test_series_are_written_only_by_the_recorder_the_engine_calls_and_gateway_series() -> None:
    elsewhere = {
        str(path.relative_to(GATEWAY.parent)): found
        for path in sorted(GATEWAY.rglob("*.py"))
        if not allowed(path) and (found := series_writes(path.read_text()))
    }

    assert elsewhere == {}, (
        "write through gateway/telemetry/recorder.py (a request's or a job's figures), "
        "gateway/engine/calls.py (an engine call's), or a named method of gateway/series/"
    )


def test_the_scanner_finds_the_writes_where_they_are_allowed() -> None:
    found = {path.name: series_writes(path.read_text()) for path in ALLOWED}

    assert len(found["recorder.py"]) > 20
    assert len(found["calls.py"]) > 5
    assert len([write for path in SERIES.rglob("*.py") for write in series_writes(path.read_text())]) > 10
    assert "labels" in FIELDS  # ReviewMetrics' counter: any ``.labels(...).inc()`` is caught
    assert {"escalations", "decisions_unlogged", "enqueued", "frames"} <= FIELDS


PLANTED = (
    "\nfrom prometheus_client import Histogram\n"
    "def planted(self, metrics: object, hist: Histogram | None, unlogged: object) -> None:\n"
    "    self.metrics.escalations.labels('review').inc()\n"
    "    strategy = metrics.prefix_strategy\n"
    "    strategy.labels('http://engine', 'prime').set(1.0)\n"
    "    assert hist is not None\n"
    "    hist.observe(1.0)\n"
    "    self._unlogged.inc(3)\n"
    "    metrics.output_token_weight.set_function(lambda: 1.0)\n"
    "    self.queued.dec()\n"
)
"""Writes of a metric reached every way the scanner knows: a planted line's offset and its write."""


def test_a_planted_write_is_caught() -> None:
    escalation = (GATEWAY / "moderation" / "escalation.py").read_text()
    assert series_writes(escalation) == []

    end = len(escalation.splitlines())  # the planted lines are numbered from the module's end
    assert [(line - end, write) for line, write in series_writes(escalation + PLANTED)] == [
        (4, "inc"), (4, "labels"), (6, "labels"), (6, "set"), (8, "observe"), (9, "inc"),
        (10, "set_function"), (11, "dec"),
    ]


def test_calling_a_named_recording_method_or_another_observe_is_not_a_write() -> None:
    source = (
        "def fine(self, metrics: object, recorder: object, redis: object) -> None:\n"
        "    metrics.engine_call('http://engine', 'verdict', 'ok', 0.1)\n"
        "    metrics.not_logged(2)\n"
        "    self.figures.escalated('review')\n"
        "    self.calls.waited(0.1)\n"
        "    self.work.observe(1, 0.1, 2, 0.2, 1.0)\n"
        "    redis.set('key', 'value')\n"
        "    self.window.observe({})\n"
    )

    assert series_writes(source) == []
