"""No module does several jobs: past 600 lines a module is split along its jobs (issue 18).

The modules still being split are named below, each on its own line; the list only shrinks, to empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "shaping", "quality", "deploy")
MAX_LINES = 600
BEING_SPLIT: frozenset[str] = frozenset()  # empty: every module has been split


def modules() -> list[Path]:
    """Every Python module of the packages, as a path relative to the repository."""
    return sorted(path.relative_to(ROOT) for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_the_packages_hold_modules() -> None:
    assert len(modules()) > 50
    assert Path("gateway/jobs/service.py") in modules()


@pytest.mark.parametrize("module", [m for m in modules() if m.as_posix() not in BEING_SPLIT], ids=str)
def test_no_module_is_over_600_lines(module: Path) -> None:
    lines = len((ROOT / module).read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES}): split it along its jobs"


@pytest.mark.parametrize("module", sorted(BEING_SPLIT))
def test_every_module_on_the_being_split_list_still_exists(module: str) -> None:
    assert (ROOT / module).is_file(), f"{module} is gone: take it off BEING_SPLIT"
