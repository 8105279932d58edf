"""The weekly report's models import nothing heavy (import circles: tests/layout/test_floors.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

QUALITY = Path(__file__).resolve().parents[2] / "quality"
HEAVY = ("numpy", "sklearn", "scipy", "statsmodels", "matplotlib", "jinja2")


def test_the_report_models_import_no_heavy_library() -> None:
    """The console reads reports through contracts.summaries: it must not pull numerics or plotting in."""
    code = f"import sys, contracts.summaries; print(sorted(set(sys.modules) & set({HEAVY!r})))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=QUALITY.parent
    )
    assert result.stdout.strip() == "[]"
