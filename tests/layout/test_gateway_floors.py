"""The gateway's own rooms on floors, as tests/layout/test_floors.py holds the top-level packages.

A room is a subpackage of ``gateway/`` (``engine``, ``moderation``, ...) or one of its top-level modules
(``settings``, ``wire``, ...). Every import that runs (at module level or inside a function) must go to a room
on the importing room's line below; the lines form a ladder with no circle, ``http`` (the edge) on top. An
import only for the type checker (under ``if TYPE_CHECKING``) may reach elsewhere, but it says why in a
comment right above it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from tests.layout.test_floors import imported_names

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

BASE = frozenset({"errors", "caller", "drain", "series", "tasks"})
"""Read by every stage: the exception tree, who a request is for, the drain flag, the metric declarations,
stopping a background task."""

FLOORS: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "caller": frozenset(),
    "drain": frozenset(),
    "tasks": frozenset(),
    # Every series is declared in one room (tests/layout/test_series_declared_once.py), on the ground floor
    # so that the engine pool, the review queue and the decision log, all below telemetry, may write theirs.
    "series": frozenset(),
    "console_settings": frozenset(),
    "renamed_settings": frozenset(),
    "state": BASE,
    "stream_store": BASE | {"state"},  # the Redis stream stores' shared set-up (jobs, review)
    "settings": BASE | {"console_settings", "renamed_settings", "state"},
    "policy": BASE,
    "wire": BASE | {"policy"},  # the API's vocabulary: low enough for every room that speaks it
    "decision_wire": BASE,  # POST /v1/decisions' vocabulary (OpenAI's Decisions shape)
    "decision_prompt": BASE | {"decision_wire"},  # a Decisions request as engine messages
    "engine": BASE | {"settings", "state"},
    "review": BASE | {"settings", "state", "stream_store", "policy", "wire"},
    "decisions": BASE | {"settings", "state", "wire", "decision_wire", "review"},
    "telemetry": BASE | {"settings", "state", "engine", "wire"},
    "moderation": BASE | {
        "settings", "state", "policy", "wire", "engine", "review", "decisions", "telemetry",
    },
    "jobs": BASE | {"settings", "state", "stream_store", "wire", "engine", "moderation", "telemetry"},
}
"""Each room and the rooms it may import at run time; ``http`` (the edge) may import every one of them."""
FLOORS["http"] = frozenset(FLOORS) | {"console_settings", "renamed_settings"}


def room(path: Path) -> str:
    """``gateway/engine/client.py`` is in room ``engine``, ``gateway/settings/process.py`` in ``settings``."""
    first = path.relative_to(GATEWAY).parts[0]
    return first.removesuffix(".py")


def gateway_imports(source: str) -> Iterator[tuple[int, str, bool, str]]:
    """``(line, room imported, for the type checker only, the comment above it)`` for each gateway import."""
    tree = ast.parse(source)
    lines = source.splitlines()
    checking: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            checking.update(id(inner) for inner in ast.walk(node))
    for node in ast.walk(tree):
        names = imported_names(node)
        above = lines[node.lineno - 2].strip() if names and node.lineno > 1 else ""
        for name in names:
            parts = name.split(".")
            if parts[0] == "gateway" and len(parts) > 1:
                yield node.lineno, parts[1], id(node) in checking, above


def wrong_imports(path: Path, source: str) -> list[str]:
    """What in ``source`` (the file at ``path``) imports a room above its own, or off its line."""
    own = room(path)
    allowed = FLOORS.get(own)
    if allowed is None:
        return [f"{path.relative_to(GATEWAY.parent)}: the room {own!r} has no floor in FLOORS yet"]
    wrong = []
    for line, target, type_only, above in gateway_imports(source):
        if target == own or target in allowed:
            continue
        if type_only and above.startswith("#"):
            continue
        why = "for the type checker without a comment saying why" if type_only else "at run time"
        wrong.append(f"{path.relative_to(GATEWAY.parent)}:{line} imports gateway.{target} {why}")
    return wrong


def test_the_rooms_are_a_ladder_with_the_edge_on_top() -> None:
    try:
        order = list(TopologicalSorter(FLOORS).static_order())
    except CycleError as exc:  # pragma: no cover - the failure message
        pytest.fail(f"the gateway's floors have a circle: {exc.args[1]}")
    assert order[-1] == "http"
    on_disk = {room(path) for path in GATEWAY.iterdir() if path.name != "__init__.py" and (
        path.suffix == ".py" or (path / "__init__.py").is_file())}
    assert on_disk == set(FLOORS), "every room of gateway/ stands on a floor"


@pytest.mark.parametrize(
    "path", sorted(set(GATEWAY.rglob("*.py")) - {GATEWAY / "__init__.py"}),
    ids=lambda path: str(path.relative_to(GATEWAY)),
)
def test_no_room_imports_one_above_it(path: Path) -> None:
    assert not wrong_imports(path, path.read_text())


def test_a_planted_upward_import_is_caught() -> None:
    engine = GATEWAY / "engine" / "client.py"
    planted = engine.read_text() + "\n\ndef late() -> None:\n    from gateway.http.app import create_app\n"
    assert wrong_imports(engine, planted) == [
        f"gateway/engine/client.py:{len(planted.splitlines())} imports gateway.http at run time"
    ]


def test_a_type_checking_import_upward_must_say_why() -> None:
    review = GATEWAY / "review" / "models.py"
    planted = "if TYPE_CHECKING:\n    from gateway.moderation import outcome\n"
    assert wrong_imports(review, planted) == [
        "gateway/review/models.py:2 imports gateway.moderation for the type checker without a comment "
        "saying why"
    ]
    said = planted.replace("    from", "    # the service hands itself in\n    from")
    assert wrong_imports(review, said) == []
