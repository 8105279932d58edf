"""A rendering of the dashboard JSON with matplotlib: each panel's queries, evaluated by a real Prometheus.

No Grafana server is installable here, so docs/telemetry.md shows this instead of a screenshot: the panels
where the JSON's ``gridPos`` puts them, titles, units and legends from the JSON, series from Prometheus's
``/api/v1/query_range`` (``$instance`` as "all replicas"). Stat panels show the last value, as Grafana's
``lastNotNull`` does. It is a rendering, not Grafana's look.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

ROW_UNITS = 1  # a row header's height in grid units
UNIT_INCHES = 0.42  # one grid unit's height
WIDTH_INCHES = 22.0  # Grafana's 24 columns


@dataclass(frozen=True, slots=True)
class Series:
    """One series a query answered: its legend and its points (seconds since the start, value)."""

    legend: str
    times: list[float]
    values: list[float]


def legend_text(legend_format: str, labels: dict[str, str]) -> str:
    """Grafana's ``{{label}}`` legend, filled from a series' labels."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda match: labels.get(match.group(1), ""), legend_format)


def query_range(
    http: httpx.Client, expr: str, legend_format: str, start: float, end: float, step: float
) -> list[Series]:
    """The series Prometheus answers for ``expr`` between ``start`` and ``end`` (Unix seconds)."""
    response = http.get(
        "/api/v1/query_range",
        params={"query": expr.replace("$instance", ".*"), "start": start, "end": end, "step": step},
    )
    response.raise_for_status()
    series = []
    for result in response.json()["data"]["result"]:
        labels = {key: value for key, value in result["metric"].items() if key != "__name__"}
        points = [(float(t) - start, float(v)) for t, v in result["values"]]
        series.append(Series(legend_text(legend_format, labels) or expr[:40], [p[0] for p in points],
                             [p[1] for p in points]))
    return series


def format_value(value: float, unit: str) -> str:
    """A stat panel's figure in the panel's unit."""
    if math.isnan(value):
        return "no data"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "percentunit":
        return f"{value * 100:.1f} %"
    return f"{value:.3g}"


def _axes_box(grid: dict[str, int], total_units: int) -> tuple[float, float, float, float]:
    """Figure coordinates (left, bottom, width, height) of a gridPos, with a margin for titles."""
    left = grid["x"] / 24 + 0.006
    width = grid["w"] / 24 - 0.012
    top = 1 - (grid["y"] + ROW_UNITS) / total_units  # the first unit holds the title
    height = grid["h"] / total_units
    return left + 0.018, top - height + 0.012, width - 0.024, height - 0.04


def render(document: dict[str, Any], prometheus_url: str, start: float, end: float, step: float,
           out: Path, caption: str, marks: Sequence[float] = ()) -> None:
    """Draw every panel of ``document`` with the series Prometheus has between ``start`` and ``end``;
    ``marks`` (seconds after ``start``, e.g. where a run's phases begin) as dotted lines on time series."""
    panels = document["panels"]
    total_units = max(panel["gridPos"]["y"] + panel["gridPos"]["h"] for panel in panels) + ROW_UNITS
    figure = plt.figure(figsize=(WIDTH_INCHES, total_units * UNIT_INCHES))
    figure.text(0.008, 1 - 0.25 / total_units, document["title"], fontsize=14, weight="bold", va="top")
    figure.text(0.3, 1 - 0.3 / total_units, caption, fontsize=8, va="top", color="#555555", wrap=True)
    with httpx.Client(base_url=prometheus_url, timeout=30) as http:
        for panel in panels:
            grid = panel["gridPos"]
            if panel["type"] == "row":
                where = 1 - (grid["y"] + ROW_UNITS + 0.7) / total_units
                figure.text(0.008, where, panel["title"], fontsize=12,
                            weight="bold", color="#1f4e79")
                continue
            unit = panel["fieldConfig"]["defaults"].get("unit", "")
            series = [
                one
                for target in panel["targets"]
                for one in query_range(http, target["expr"], target.get("legendFormat", ""), start, end, step)
            ]
            axes = figure.add_axes(_axes_box(grid, total_units))
            axes.set_title(panel["title"], fontsize=9, loc="left")
            if panel["type"] == "stat":
                _stat(axes, series, unit)
            else:
                _timeseries(axes, series, unit, panel["fieldConfig"]["defaults"])
                for mark in marks:
                    axes.axvline(mark / 60, color="grey", linestyle=":", linewidth=0.8)
    figure.savefig(out, dpi=72)
    plt.close(figure)


def _stat(axes: Any, series: list[Series], unit: str) -> None:
    axes.set_axis_off()
    values = [v for one in series for v in one.values[-1:] if not math.isnan(v)]
    text = " / ".join(format_value(v, unit) for v in values[:3]) or "no data"
    axes.text(0.5, 0.4, text, ha="center", va="center", fontsize=20, color="#2e7d32",
              transform=axes.transAxes)


def _timeseries(axes: Any, series: list[Series], unit: str, defaults: dict[str, Any]) -> None:
    scale = 100.0 if unit == "percentunit" else 1.0
    for one in series:
        minutes = [t / 60 for t in one.times]
        axes.plot(minutes, [v * scale for v in one.values], linewidth=1.2, label=one.legend)
    axes.set_ylim(bottom=defaults.get("min", 0))
    if "max" in defaults:
        axes.set_ylim(top=defaults["max"] * scale * 1.05)
    axes.tick_params(labelsize=7)
    axes.set_xlabel("minutes into the run", fontsize=7)
    axes.set_ylabel({"s": "seconds", "percentunit": "%", "reqps": "requests/s"}.get(unit, ""), fontsize=7)
    axes.grid(alpha=0.3)
    if series:
        axes.legend(fontsize=6, loc="upper left", ncol=2, frameon=False)
    else:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes, color="grey")
