"""MODGATE_SHAPING__IMAGE_TOKEN_BUDGET below what the engine honours is refused at start, with the
smallest budget that works (shaping.tokens.smallest_honoured_budget: 128 at 32 pixels a token)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("pixels_per_token", "smallest"), [("32", 128), ("28", 168)])
def test_a_budget_under_the_smallest_honoured_one_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, pixels_per_token: str, smallest: int
) -> None:
    monkeypatch.setenv("MODGATE_SHAPING__PIXELS_PER_TOKEN", pixels_per_token)
    monkeypatch.setenv("MODGATE_SHAPING__IMAGE_TOKEN_BUDGET", str(smallest - 1))

    with pytest.raises(
        ValidationError, match=f"Set MODGATE_SHAPING__IMAGE_TOKEN_BUDGET to {smallest} or more"
    ):
        Settings()


@pytest.mark.parametrize("budget", ["1", "64", "127"])
def test_every_budget_the_old_bound_let_through_is_refused(
    monkeypatch: pytest.MonkeyPatch, budget: str
) -> None:
    monkeypatch.setenv("MODGATE_SHAPING__IMAGE_TOKEN_BUDGET", budget)

    with pytest.raises(ValidationError, match="is below 128, the smallest budget the engine honours"):
        Settings()


@pytest.mark.parametrize(("pixels_per_token", "smallest"), [("32", 128), ("28", 168)])
def test_the_smallest_honoured_budget_itself_is_accepted(
    monkeypatch: pytest.MonkeyPatch, pixels_per_token: str, smallest: int
) -> None:
    monkeypatch.setenv("MODGATE_SHAPING__PIXELS_PER_TOKEN", pixels_per_token)
    monkeypatch.setenv("MODGATE_SHAPING__IMAGE_TOKEN_BUDGET", str(smallest))

    assert Settings().shaping.image_token_budget == smallest


def test_modgate_serve_refuses_to_start_with_a_budget_the_engine_would_not_honour() -> None:
    env = {**os.environ, "MODGATE_SHAPING__IMAGE_TOKEN_BUDGET": "100"}

    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 2, result.stdout + result.stderr
    assert "invalid settings" in result.stderr
    assert "MODGATE_SHAPING__IMAGE_TOKEN_BUDGET=100 is below 128" in result.stderr
    assert "Set MODGATE_SHAPING__IMAGE_TOKEN_BUDGET to 128 or more" in result.stderr
    assert "listening" not in result.stdout
