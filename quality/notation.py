"""How the report writes its figures: percentages, intervals, percentage points and counts.

Shared by the recommendation's sentences and both renderings (the HTML template uses them as filters).
"""

from __future__ import annotations

import math

__all__ = ["count", "interval", "pct", "points", "points_interval"]


def pct(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value * 100:.{digits}f} %"


def interval(low: float | None, high: float | None, digits: int = 1) -> str:
    if low is None or high is None:
        return ""
    return f"[{low * 100:.{digits}f}, {high * 100:.{digits}f}]"


def count(value: int) -> str:
    return f"{value:,}"


def points(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 100:+.2f} points"


def points_interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return ""
    return f"[{low * 100:+.2f}, {high * 100:+.2f}]"
