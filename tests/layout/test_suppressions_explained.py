"""Every suppression says why (issue 18): each noqa, type: ignore and pragma: no cover carries its reason.

The reason follows the rule codes on the same line, after a dash or a second comment:
``# noqa: S105 - a loopback benchmark's own gateway``, ``# type: ignore[arg-type]  # a JSON list``.
Only comments are read (with tokenize), never strings that happen to spell a directive. In pyproject.toml,
every ruff rule that is switched off names its reason on its own line, and every mypy override says why.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("gateway", "shaping", "quality", "deploy", "bench", "tests", "scripts")

DIRECTIVE = re.compile(r"#\s*(?:noqa\b|type:\s*ignore\b|pragma:\s*no\s*cover\b)", re.IGNORECASE)
RUFF_CODES = r"noqa:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*"
MYPY_CODES = r"type:\s*ignore\[[a-z0-9-]+(?:\s*,\s*[a-z0-9-]+)*\]"
EXPLAINED = re.compile(rf"#\s*(?:{RUFF_CODES}|{MYPY_CODES}|pragma:\s*no\s*cover)\s+[-#]\s*[^\s#-]")
RULE_CODE = re.compile(r'"[A-Z]+[0-9]+"')


def unexplained(source: str) -> list[tuple[int, str]]:
    """The (line, comment) of each suppression in the source's comments that names no codes or no reason."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        for directive in DIRECTIVE.finditer(token.string):
            if not EXPLAINED.match(token.string, directive.start()):
                found.append((token.start[0], token.string))
    return found


def modules() -> list[Path]:
    """Every Python file of the folders, relative to the repository."""
    return sorted(path.relative_to(ROOT) for folder in FOLDERS for path in (ROOT / folder).rglob("*.py"))


def test_a_suppression_without_codes_or_reason_is_found() -> None:
    source = (
        "a = 1  # noqa\n"
        "b = 2  # noqa: S105\n"
        "c = f(a)  # type: ignore\n"
        "d = f(b)  # type: ignore[arg-type]\n"
        "raise AssertionError  # pragma: no cover\n"
        "e = 3  # a comment, then  # noqa: E501\n"
    )
    assert [line for line, _ in unexplained(source)] == [1, 2, 3, 4, 5, 6]


def test_a_suppression_with_codes_and_reason_passes() -> None:
    source = (
        "TOKEN = 'x'  # noqa: S105 - a loopback benchmark's own gateway\n"
        "import os  # noqa: E402, F401 - after the logger is quieted\n"
        "await pipe.unwatch()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated\n"
        "raise AssertionError('unreachable')  # pragma: no cover - for mypy\n"
    )
    assert unexplained(source) == []


def test_directives_inside_strings_are_not_comments() -> None:
    assert unexplained('text = "# noqa"\nmore = """\n# type: ignore\n"""\n') == []


def test_the_folders_hold_suppressions_to_check() -> None:
    directives = sum(len(DIRECTIVE.findall((ROOT / module).read_text())) for module in modules())
    assert len(modules()) > 200
    assert directives > 20  # a scan that finds nothing would pass without checking anything


def test_every_suppression_says_why() -> None:
    offenders = [
        f"{module}:{line}: {comment}"
        for module in modules()
        for line, comment in unexplained((ROOT / module).read_text())
    ]
    assert not offenders, "name the codes and say why, e.g. `# noqa: S105 - reason`:\n" + "\n".join(offenders)


def test_every_switched_off_ruff_rule_in_pyproject_says_why() -> None:
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    named = [
        line for line in lines if RULE_CODE.search(line) and not line.startswith(("select", "extend-select"))
    ]
    assert len(named) > 5
    assert [line for line in named if "#" not in line.partition('"')[2]] == []


def test_every_mypy_override_in_pyproject_says_why() -> None:
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    overrides = [number for number, line in enumerate(lines) if line.strip() == "[[tool.mypy.overrides]]"]
    assert overrides
    assert [lines[number + 1] for number in overrides if not lines[number + 1].lstrip().startswith("#")] == []
