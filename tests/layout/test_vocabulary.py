"""A vocabulary is declared once and imported everywhere else (issue 18): the actions, contracts/actions.py.

Read from the source: a ``Literal``, tuple, list or set that spells "allow", "review", "block" one after the
other is a second declaration of the actions, wherever in a module it is written.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from shaping.verdict import ACTIONS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shaping", "contracts", "gateway", "quality", "deploy", "cli")
HOME = "contracts/actions.py"  # ``Action`` and ``ACTIONS``


def spells_the_actions(node: ast.AST) -> bool:
    """Whether ``node`` is a tuple, list or set (a ``Literal[...]``'s subscript is a tuple) whose items hold
    "allow", "review", "block" one after the other."""
    if not isinstance(node, ast.Tuple | ast.List | ast.Set):
        return False
    strings = [item.value if isinstance(item, ast.Constant) else None for item in node.elts]
    return any(tuple(strings[i : i + len(ACTIONS)]) == ACTIONS for i in range(len(strings)))


def declarations(path: Path) -> list[int]:
    """The lines of ``path`` that spell the actions out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted({node.lineno for node in ast.walk(tree) if spells_the_actions(node)})


def modules() -> list[str]:
    """Every Python module of the packages, as a path relative to the repository."""
    return sorted(
        path.relative_to(ROOT).as_posix() for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    )


def test_the_actions_are_declared_in_their_home() -> None:
    assert declarations(ROOT / HOME), f"{HOME} no longer declares the actions: the test reads the wrong place"


@pytest.mark.parametrize(
    "source",
    [
        'Action = Literal["allow", "review", "block"]',
        'action: typing.Literal["allow", "review", "block", None] = None',
        'ACTIONS = ("allow", "review", "block")',
        'if label not in ["allow", "review", "block"]: pass',
    ],
)
def test_a_copy_is_found_however_it_is_spelled(source: str, tmp_path: Path) -> None:
    module = tmp_path / "copy.py"
    module.write_text(source + "\n")
    assert declarations(module) == [1]


def test_other_uses_of_the_words_are_not_copies(tmp_path: Path) -> None:
    module = tmp_path / "uses.py"
    module.write_text('Why = Literal["review", "low_confidence"]\nfirst = ("allow", "block")\nx = "review"\n')
    assert declarations(module) == []


@pytest.mark.parametrize("module", [m for m in modules() if m != HOME], ids=str)
def test_no_other_module_declares_the_actions(module: str) -> None:
    lines = declarations(ROOT / module)
    assert not lines, f"{module}:{lines} spells out allow/review/block: import Action or ACTIONS from {HOME}"
