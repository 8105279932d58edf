"""The weekly report's modules: its models import nothing heavy, and no quality module imports in a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

QUALITY = Path(__file__).resolve().parents[2] / "quality"
HEAVY = ("numpy", "sklearn", "scipy", "statsmodels", "matplotlib", "jinja2")


def quality_imports(path: Path) -> set[str]:
    """The quality modules ``path`` imports (``from quality import charts`` gives ``charts``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[1] for a in node.names if a.name.startswith("quality."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "quality":
                names.update(alias.name for alias in node.names)
            elif node.module.startswith("quality."):
                names.add(node.module.split(".")[1])
    return names


def test_the_report_models_import_no_heavy_library() -> None:
    """The console reads reports through quality.summaries: it must not pull numerics or plotting in."""
    code = f"import sys, quality.summaries; print(sorted(set(sys.modules) & set({HEAVY!r})))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=QUALITY.parent
    )
    assert result.stdout.strip() == "[]"


def test_no_quality_module_imports_in_a_circle() -> None:
    graph = {path.stem: quality_imports(path) for path in QUALITY.glob("*.py")}
    assert graph["report"] >= {"summaries", "rendering"}, graph["report"]
    assert "summaries" in graph["charts"]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            name == goal or (name not in seen and reaches(name, goal, seen | {name}))
            for name in graph.get(start, set())
        )

    circles = sorted(module for module in graph if reaches(module, module, set()))
    assert not circles, f"quality modules in an import circle: {circles}"
