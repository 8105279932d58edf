"""No module does several jobs: past 600 lines a module is split along its jobs (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shaping", "contracts", "gateway", "quality", "deploy", "cli")
MAX_LINES = 600


def modules() -> list[Path]:
    """Every Python module of the packages, as a path relative to the repository."""
    return sorted(path.relative_to(ROOT) for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_the_packages_hold_modules() -> None:
    assert len(modules()) > 50
    assert Path("gateway/jobs/service.py") in modules()


@pytest.mark.parametrize("module", modules(), ids=str)
def test_no_module_is_over_600_lines(module: Path) -> None:
    lines = len((ROOT / module).read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES}): split it along its jobs"
