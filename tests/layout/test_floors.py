"""The house's floors: which top-level package may import which, read from every import statement in the
source (top-level, inside a function, or under ``TYPE_CHECKING``), so a lazy import is caught too.

``contracts`` is the ground floor (the records and vocabulary the service, the shaping library and the report
share; it imports nothing of the project), ``shaping`` pure library code above it, ``gateway`` (the service)
and ``quality`` (the report) side by side above them, ``deploy`` above the service, and the command line
(``cli``) on top: it may import everything and nothing imports it but the benchmarks. A package's import of
one not on its line is an upward (or sideways) import and fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FLOORS: dict[str, frozenset[str]] = {
    "contracts": frozenset(),
    "shaping": frozenset({"contracts"}),
    "gateway": frozenset({"shaping", "contracts"}),
    "quality": frozenset({"shaping", "contracts"}),
    "deploy": frozenset({"shaping", "contracts", "gateway"}),
    "cli": frozenset({"shaping", "contracts", "gateway", "quality", "deploy"}),
    "bench": frozenset({"shaping", "contracts", "gateway", "quality", "deploy", "cli"}),
    "tests": frozenset({"shaping", "contracts", "gateway", "quality", "deploy", "cli", "bench"}),
}
"""Each package and the packages it may import."""


def modules(package: str) -> list[Path]:
    """The package's Python files."""
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    """``gateway/engine/client.py`` as ``gateway.engine.client`` (a package's ``__init__`` as the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, eager_only: bool = False) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for each import of one of the project's packages in ``path``. ``eager_only``: the
    imports run when the module is imported (module level, outside ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = _eager(tree.body) if eager_only else ast.walk(tree)
    for node in nodes:
        for name in imported_names(node):
            if name.split(".")[0] in FLOORS:
                yield node.lineno, name


def imported_names(node: ast.AST) -> list[str]:
    """The absolute modules an import statement names (none for any other node, or a relative import)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
        return [node.module]
    return []


def _eager(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import: the body, into ``try``/``if`` blocks, except ``if TYPE_CHECKING``."""
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _eager(node.body)
                yield from _eager(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _eager(node.body)
        else:
            yield node


def test_the_floors_are_a_ladder_with_the_command_line_on_top() -> None:
    order = list(TopologicalSorter(FLOORS).static_order())
    assert order.index("contracts") < order.index("shaping") < order.index("gateway") < order.index("cli")
    on_top = {"bench", "tests"}
    assert not [package for package, allowed in FLOORS.items() if "cli" in allowed and package not in on_top]
    assert sorted(path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()) == sorted(FLOORS)


@pytest.mark.parametrize("package", list(FLOORS))
def test_no_package_imports_one_above_it_or_beside_it(package: str) -> None:
    allowed = FLOORS[package] | {package}
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules(package)
        for line, name in imports(path)
        if name.split(".")[0] not in allowed
    ]
    assert not upward, "\n".join(upward)


def test_no_module_imports_in_a_circle() -> None:
    """Among the imports that run when a module is imported: a circle there is an import order that works
    only by luck (the first module half-initialised when the second reads it)."""
    graph: dict[str, set[str]] = {}
    known = {module_name(path) for package in FLOORS for path in modules(package)}
    for package in FLOORS:
        for path in modules(package):
            reached = set()
            for _, name in imports(path, eager_only=True):
                # ``from a.b import c`` reaches a.b (or a.b.c when c is a module); either way a module we have
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name and name != module_name(path):
                    reached.add(name)
            graph[module_name(path)] = reached
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        pytest.fail(f"modules importing each other in a circle: {' -> '.join(exc.args[1])}")
