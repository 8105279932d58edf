"""The engine behind one seam: outside ``gateway/engine/`` no code asks which kind an engine is, and no code
but the engine's own client opens an HTTP client to it.

What differs between engines is carried by each kind's wire (``gateway/engine/wires/``); elsewhere the kind
is a label (a metric's, ``/readyz``'s, a record's), never a branch. Read from the source's syntax trees:

- a comparison (``==``, ``!=``, ``in``, ``not in``) with an engine kind's name (``"vllm"``, ``"llamacpp"``)
  on either side, alone or inside a literal tuple, list, set or dict;
- ``isinstance(..., SomethingWire)``;
- any use of a name that asks it directly (``serves_llamacpp``).

Scanned: ``gateway/`` but its engine package, ``shaping/`` and ``cli/``: the code that talks to engines or
plans for them. Not scanned, and why: ``deploy/`` (the simulator's own laws, one per engine it imitates; the
compose files' reading in ``deploy/check/`` and ``deploy/predict.py``, which name the engine they start);
``quality/`` and ``contracts/`` (an engine there is a record's arm read back from the decision log, a value
in a table, not an engine the code talks to).
"""

from __future__ import annotations

import ast
from pathlib import Path

from gateway.engine.wires import WIRES

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("gateway", "shaping", "cli")
SEAM = ROOT / "gateway" / "engine"
KIND_NAMES = frozenset(WIRES) | {"vllm", "llamacpp"}
DIRECT_QUESTIONS = frozenset({"serves_llamacpp", "serves_vllm"})

SIDE_CLIENTS_ALLOWED: dict[str, tuple[int, str]] = {
    "gateway/engine/client.py": (1, "the engine's own client: every engine request goes through it"),
    "gateway/jobs/webhooks.py": (1, "a tenant's webhook, not an engine"),
    "gateway/http/services.py": (1, "the OpenID Connect provider's client, not an engine"),
}
"""Files that may open an ``httpx.AsyncClient``, how many times, and why."""


def scanned_files() -> list[Path]:
    """The Python files outside the engine package that are scanned."""
    return sorted(
        path for package in SCANNED for path in (ROOT / package).rglob("*.py") if SEAM not in path.parents
    )


def _names_a_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in KIND_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_kind(element) for element in node.elts)
    if isinstance(node, ast.Dict):
        return any(key is not None and _names_a_kind(key) for key in node.keys)
    return False


def kind_questions(tree: ast.AST) -> list[tuple[int, str]]:
    """Every place in a syntax tree that asks which kind an engine is: (line, what)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            _names_a_kind(side) for side in (node.left, *node.comparators)
        ):
            found.append((node.lineno, f"compares with an engine kind: {ast.unparse(node)}"))
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
            and len(node.args) == 2 and "Wire" in ast.unparse(node.args[1])
        ):
            found.append((node.lineno, f"asks a wire's class: {ast.unparse(node)}"))
        elif isinstance(node, ast.Name | ast.Attribute | ast.alias):
            if isinstance(node, ast.Name):
                name = node.id
            else:
                name = node.attr if isinstance(node, ast.Attribute) else node.name.rpartition(".")[2]
            if name in DIRECT_QUESTIONS:
                found.append((getattr(node, "lineno", 0), f"asks directly: {name}"))
    return sorted(found)


def side_clients(tree: ast.AST) -> list[int]:
    """The lines that open an ``httpx.AsyncClient``."""
    return sorted(
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in {"httpx.AsyncClient", "AsyncClient"}
    )


def test_no_code_outside_the_engine_package_asks_which_kind_an_engine_is() -> None:
    questions = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in scanned_files()
        for line, what in kind_questions(ast.parse(path.read_text(), str(path)))
    ]
    assert not questions, "ask the engine's wire instead (gateway/engine/wires/):\n" + "\n".join(questions)


def test_the_kind_question_finder_sees_each_shape_of_the_question() -> None:
    source = """
if kind == "llamacpp": pass
if engine.kind != "vllm": pass
if cache.get("engine_kind") in ("vllm", "llamacpp"): pass
if isinstance(wire, LlamaCppWire): pass
from gateway.engine.prefix import serves_llamacpp
if measurement.kind == "scaffold": pass
label = {"kind": engine.kind}
"""
    lines = [line for line, _ in kind_questions(ast.parse(source))]
    assert lines == [2, 3, 4, 5, 6]  # a kind as a label (the last two lines) is no question


def test_only_the_engine_client_opens_an_http_client_to_an_engine() -> None:
    opened: dict[str, list[int]] = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        lines = side_clients(ast.parse(path.read_text(), str(path)))
        if lines:
            opened[str(path.relative_to(ROOT))] = lines
    extra = {
        path: lines for path, lines in opened.items()
        if len(lines) > SIDE_CLIENTS_ALLOWED.get(path, (0, ""))[0]
    }
    assert not extra, f"an engine request outside EngineClient (use the engine's client): {extra}"
    assert set(opened) == set(SIDE_CLIENTS_ALLOWED), "an allowed file opens no client now: tidy the list"


def test_the_command_line_tools_that_talk_to_an_engine_open_no_client_of_their_own() -> None:
    for name in ("prefix.py", "cache_probe.py"):
        tree = ast.parse((ROOT / "cli" / name).read_text())
        assert side_clients(tree) == [], name
