"""The weekly report's charts, drawn with matplotlib's object API and returned as PNG bytes.

No pyplot: figures are built on an Agg canvas directly, so nothing touches matplotlib's global figure
manager and charts can be drawn from worker threads. Every chart is a row of small multiples sharing
one palette: thinking on in blue, thinking off in orange, a thinking-on re-run in grey.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

from contracts.summaries import ArmCost, CategoryRow, Comparison, LabelSection, ReportPolicy, WeekSummary
from shaping.verdict import ACTIONS

__all__ = ["category_chart", "confusion_chart", "cost_chart", "label_chart", "png_data_uri", "trend_chart"]

ARM_COLORS = {
    "thinking_on": "#2f5dab",
    "thinking_off": "#e07a2f",
    "thinking_on_rerun": "#8b93a1",
    "thinking_off_json": "#b8860b",
    "thinking_on_json": "#6a4c93",
}
ARM_LABELS = {
    "thinking_on": "thinking on",
    "thinking_off": "thinking off",
    "thinking_on_rerun": "on re-run",
    "thinking_off_json": "off, JSON verdict",
    "thinking_on_json": "on, JSON verdict",
}
PASS, WARN, FAIL, MUTED = "#1f7a4d", "#b7791f", "#c2412d", "#9aa3ad"
INK, SUBTLE, GRID = "#1d2430", "#5b6472", "#e6e9ee"
DPI = 144


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    figure.set_facecolor("white")
    return figure


def _style(ax: Axes, title: str, *, grid_axis: Literal["both", "x", "y"] = "x") -> None:
    ax.set_title(title, loc="left", fontsize=10, color=INK, fontweight="bold", pad=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.spines["bottom"].set_color(GRID)
    ax.tick_params(colors=SUBTLE, labelsize=8, length=0)
    ax.grid(axis=grid_axis, color=GRID, linewidth=0.8)
    ax.set_axisbelow(True)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return buffer.getvalue()


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _matrix(ax: Axes, counts: Sequence[Sequence[int]], labels: Sequence[str], title: str, arms: str) -> None:
    table = np.asarray(counts, dtype=float)
    row_totals = table.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(row_totals > 0, table / row_totals, 0.0)
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1.25, aspect="equal")
    for (row, col), count in np.ndenumerate(table):
        share = shares[row, col]
        color = "white" if share > 0.62 else INK
        text = f"{int(count):,}\n{share:.1%}" if row_totals[row, 0] else "0"
        ax.text(col, row, text, ha="center", va="center", fontsize=8.5, color=color, linespacing=1.3)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yticks(range(len(labels)), labels)
    ax.xaxis.set_ticks_position("top")
    ax.xaxis.set_label_position("top")
    reference, candidate = arms.split(" vs ")
    ax.set_xlabel(candidate, fontsize=8, color=SUBTLE)
    ax.set_ylabel(reference, fontsize=8, color=SUBTLE)
    ax.tick_params(colors=SUBTLE, labelsize=8, length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, loc="left", fontsize=10, color=INK, fontweight="bold", pad=22)


def confusion_chart(comparison: Comparison, noise_floor: Comparison | None = None) -> bytes:
    """Flagged 2x2 and action 3x3 tables (row shares shaded), and the re-run's 2x2 when there is one."""
    panels = 3 if noise_floor is not None else 2
    figure = _figure(3.2 * panels + 0.4, 3.1)
    axes = figure.subplots(1, panels)
    arms = f"{ARM_LABELS[comparison.reference]} vs {ARM_LABELS[comparison.candidate]}"
    _matrix(axes[0], comparison.flagged_table, ["flagged", "safe"], "Flagged, on vs off", arms)
    _matrix(axes[1], comparison.action_table, list(ACTIONS), "Action, on vs off", arms)
    if noise_floor is not None:
        rerun_arms = f"{ARM_LABELS[noise_floor.reference]} vs {ARM_LABELS[noise_floor.candidate]}"
        _matrix(
            axes[2], noise_floor.flagged_table, ["flagged", "safe"], "Flagged, on vs on re-run", rerun_arms
        )
    return _png(figure)


def _status_color(row: CategoryRow) -> str:
    if not row.judged or row.flagged_agreement is None:
        return MUTED
    return FAIL if row.below_threshold else PASS


def agreement_axis_floor(lows: Sequence[float], minimum: float) -> float:
    """The left end of an agreement axis: below every interval drawn and the policy line, in 10-point
    steps (5 when everything sits above 90 %), never below 0."""
    bottom = min([minimum, *lows])
    step = 0.05 if bottom >= 0.9 else 0.1
    return max(0.0, math.floor((bottom - 0.01) / step) * step)


def category_chart(categories: Sequence[CategoryRow], policy: ReportPolicy) -> bytes:
    """Per category: agreement on flagged frames with its interval, and each arm's flag rate.

    Every row of the report's category table is drawn, and the axis starts below the lowest interval,
    so a category far under the minimum is on the picture as it is in the table.
    """
    rows = list(categories)
    height = max(2.2, 0.36 * len(rows) + 1.2)
    figure = _figure(10.4, height)
    left, right = figure.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1.35, 1]})
    positions = np.arange(len(rows))[::-1]
    names = [row.category for row in rows]

    _style(left, "Agreement on frames thinking on flagged")
    floor = agreement_axis_floor(
        [row.flagged_agreement.low for row in rows if row.flagged_agreement is not None],
        policy.min_flagged_agreement,
    )
    for y, row in zip(positions, rows, strict=True):
        rate = row.flagged_agreement
        color = _status_color(row)
        if rate is None:
            left.text(floor + 0.002, y, "no flagged frames", va="center", fontsize=8, color=MUTED)
            continue
        left.plot(
            [rate.low, rate.high], [y, y], color=color, linewidth=2.2, solid_capstyle="round", alpha=0.55
        )
        left.plot([rate.value], [y], "o", color=color, markersize=6)
        left.text(1.012, y, f"{rate.value:.0%}  n={rate.n:,}", va="center", fontsize=7.5, color=SUBTLE)
    left.axvline(policy.min_flagged_agreement, color=FAIL, linestyle=(0, (3, 3)), linewidth=1)
    left.text(
        policy.min_flagged_agreement,
        -0.62,
        f" min {policy.min_flagged_agreement:.0%}",
        fontsize=7.5,
        color=FAIL,
        va="bottom",
    )
    left.set_xlim(floor, 1.0)
    left.set_ylim(-0.7, len(rows) - 0.3)
    left.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    left.set_yticks(positions, names)

    _style(right, "Share of frames flagged, by arm")
    height_bar = 0.36
    for offset, arm, values in (
        (height_bar / 2, "thinking_on", [row.reference_rate for row in rows]),
        (-height_bar / 2, "thinking_off", [row.candidate_rate for row in rows]),
    ):
        right.barh(
            positions + offset, values, height=height_bar, color=ARM_COLORS[arm], label=ARM_LABELS[arm]
        )
    right.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=1))
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncols=2, fontsize=7.5, frameon=False)
    right.tick_params(axis="y", labelleft=False)
    return _png(figure)


def _band(
    ax: Axes,
    x: Sequence[int],
    values: Sequence[float | None],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
    color: str,
    label: str,
) -> None:
    points = [(i, v, lo, hi) for i, v, lo, hi in zip(x, values, lows, highs, strict=True) if v is not None]
    if not points:
        return
    xs = [p[0] for p in points]
    ax.fill_between(
        xs,
        [p[2] if p[2] is not None else p[1] for p in points],
        [p[3] if p[3] is not None else p[1] for p in points],
        color=color,
        alpha=0.16,
        linewidth=0,
    )
    ax.plot(xs, [p[1] for p in points], "-o", color=color, markersize=4, linewidth=1.6, label=label)


def trend_chart(trend: Sequence[WeekSummary], policy: ReportPolicy) -> bytes:
    """Agreement and flagged agreement per week with their intervals, the re-run noise floor dashed."""
    figure = _figure(10.4, 2.7)
    left, right = figure.subplots(1, 2, sharex=True)
    x = list(range(len(trend)))
    weeks = [summary.week.split("-")[1] for summary in trend]

    _style(left, "Agreement, all frames", grid_axis="y")
    _band(
        left,
        x,
        [s.agreement for s in trend],
        [s.agreement_low for s in trend],
        [s.agreement_high for s in trend],
        ARM_COLORS["thinking_off"],
        "on vs off",
    )
    noise = [s.noise_floor for s in trend]
    if any(v is not None for v in noise):
        _band(
            left,
            x,
            noise,
            [s.noise_floor_low for s in trend],
            [s.noise_floor_high for s in trend],
            ARM_COLORS["thinking_on_rerun"],
            "on vs on re-run",
        )
    left.axhline(policy.min_agreement, color=FAIL, linestyle=(0, (3, 3)), linewidth=1)

    _style(right, "Agreement on flagged frames", grid_axis="y")
    _band(
        right,
        x,
        [s.flagged_agreement for s in trend],
        [s.flagged_agreement_low for s in trend],
        [s.flagged_agreement_high for s in trend],
        ARM_COLORS["thinking_off"],
        "on vs off",
    )
    right.axhline(policy.min_flagged_agreement, color=FAIL, linestyle=(0, (3, 3)), linewidth=1)

    panels = (
        (left, policy.min_agreement, [v for s in trend for v in (s.agreement_low, s.noise_floor_low)]),
        (right, policy.min_flagged_agreement, [s.flagged_agreement_low for s in trend]),
    )
    for ax, floor, candidates in panels:
        lows = [v for v in candidates if v is not None]
        bottom = min([floor, *lows])
        step = 0.01 if bottom > 0.9 else 0.05
        ax.set_ylim(max(0.0, math.floor((bottom - step / 2) / step) * step), 1.002)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_xticks(x, weeks)
        ax.set_xlim(-0.4, max(len(trend) - 0.6, 0.4))
    left.legend(loc="lower left", fontsize=7.5, frameon=False)
    return _png(figure)


def cost_chart(costs: Sequence[ArmCost]) -> bytes:
    """Latency distribution per arm (log scale) and tokens per frame split into reasoning and answer."""
    figure = _figure(10.4, 2.7)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.35, 1]})

    _style(left, "End-to-end latency per frame", grid_axis="both")
    shortest, longest = math.inf, 0.0
    for cost in costs:
        if cost.latency_quantiles_ms:
            seconds = np.maximum(np.asarray(cost.latency_quantiles_ms) / 1000, 1e-3)
            fractions = np.linspace(0, 1, seconds.size)
            shortest, longest = min(shortest, float(seconds[0])), max(longest, float(seconds[-1]))
            label = f"{ARM_LABELS[cost.arm]} (median {cost.latency_p50_ms / 1000:.2f} s)"
            left.plot(seconds, fractions, color=ARM_COLORS[cost.arm], linewidth=1.8, label=label)
    left.set_xscale("log")
    if math.isfinite(shortest):
        ticks = [
            t
            for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200)
            if shortest / 1.5 <= t <= longest * 1.5
        ]
        left.set_xticks(ticks)
        left.minorticks_off()
    left.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} s"))
    left.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    left.set_ylabel("frames at or under", fontsize=8, color=SUBTLE)
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3, fontsize=7.5, frameon=False)

    _style(right, "Completion tokens per frame (mean)")
    names = [ARM_LABELS[cost.arm] for cost in costs]
    reasoning = [cost.mean_reasoning_tokens for cost in costs]
    answer = [max(0.0, cost.mean_completion_tokens - cost.mean_reasoning_tokens) for cost in costs]
    positions = np.arange(len(costs))[::-1]
    colors = [ARM_COLORS[cost.arm] for cost in costs]
    right.barh(positions, reasoning, color=colors, alpha=0.45, height=0.55, label="reasoning")
    right.barh(positions, answer, left=reasoning, color=colors, height=0.55, label="answer")
    for y, r, a in zip(positions, reasoning, answer, strict=True):
        right.text(r + a, y, f"  {r + a:.0f}", va="center", fontsize=8, color=INK)
    right.set_yticks(positions, names)
    right.set_xlim(0, max([r + a for r, a in zip(reasoning, answer, strict=True)] + [1]) * 1.18)
    right.text(
        1.0,
        -0.2,
        "pale: reasoning   solid: answer",
        transform=right.transAxes,
        ha="right",
        fontsize=7,
        color=SUBTLE,
    )
    return _png(figure)


MODE_COLORS = {"on": ARM_COLORS["thinking_on"], "off": ARM_COLORS["thinking_off"], "escalate": "#1f7a4d"}


def label_chart(section: LabelSection, policy: ReportPolicy) -> bytes:
    """Accuracy against people's labels per arm and engine, with its interval, and the threshold's source."""
    rows = list(section.arms)
    figure = _figure(10.4, max(1.8, 0.42 * len(rows) + 1.2))
    ax = figure.subplots()
    source = "human labels" if section.threshold.source == "labels" else "thinking-on agreement"
    _style(ax, f"Accuracy against people's labels (weighted); escalation threshold from {source}")
    positions = np.arange(len(rows))[::-1]
    floor = agreement_axis_floor([row.accuracy.low for row in rows], policy.min_agreement)
    for y, row in zip(positions, rows, strict=True):
        color = MODE_COLORS.get(row.arm, MUTED)
        ax.plot([row.accuracy.low, row.accuracy.high], [y, y], color=color, linewidth=2.2,
                solid_capstyle="round", alpha=0.55)
        ax.plot([row.accuracy.value], [y], "o", color=color, markersize=6)
        ax.text(1.012, y, f"{row.accuracy.value:.1%}  n={row.labels:,} (eff. {row.effective_labels:.0f})",
                va="center", fontsize=7.5, color=SUBTLE)
    ax.set_xlim(floor, 1.0)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
    ax.set_yticks(positions, [f"{row.arm} · {row.engine}" for row in rows])
    return _png(figure)
