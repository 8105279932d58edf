"""The weekly quality report: what turning thinking off costs in verdicts, led by a recommendation.

`build_weekly_report` is plain CPU work over a list of records (call it from a thread in a server);
`render_html`, `render_markdown` and `render_json` turn the result into files an operator reads.

This module assembles the report and is its public surface. The parts, each one job: the models in
:mod:`quality.summaries` (light: the console reads reports through them), the sections computed in
:mod:`quality.sections` and :mod:`quality.escalation`, the recommendation in :mod:`quality.recommendation`,
the rendering in :mod:`quality.rendering` (charts from :mod:`quality.charts`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from quality.escalation import threshold_section
from quality.recommendation import recommend
from quality.records import (
    ARMS,
    Arm,
    VerdictRecord,
    format_iso_week,
    pair_records,
    parse_iso_week,
    week_bounds,
)
from quality.rendering import render_html, render_json, render_markdown
from quality.sections import arm_costs, category_rows, compare, human_scores, sample_size_needed, tenant_rows
from quality.summaries import (
    ArmCost,
    CategoryRow,
    Coefficient,
    Comparison,
    DataNotes,
    Decision,
    HumanScore,
    Rate,
    Recommendation,
    ReportPolicy,
    WeeklyReport,
    WeekSummary,
)

__all__ = [
    "ArmCost",
    "CategoryRow",
    "Coefficient",
    "Comparison",
    "Decision",
    "HumanScore",
    "Rate",
    "Recommendation",
    "ReportFiles",
    "ReportPolicy",
    "WeekSummary",
    "WeeklyReport",
    "build_weekly_report",
    "load_previous_summaries",
    "render_html",
    "render_json",
    "render_markdown",
    "write_report",
]

logger = logging.getLogger(__name__)


FORMAT_COMPARISONS: tuple[tuple[Arm, Arm], ...] = (
    ("thinking_off_json", "thinking_off"),  # does the compact form change what thinking off says?
    ("thinking_on", "thinking_off_json"),  # the JSON form's own agreement with thinking on
    ("thinking_on_json", "thinking_on"),  # the format with thinking on
)


def build_weekly_report(
    records: Iterable[VerdictRecord],
    week: str,
    policy: ReportPolicy | None = None,
    previous: Sequence[WeekSummary] = (),
    generated_at: datetime | None = None,
) -> WeeklyReport:
    """Everything the report says about one ISO week (`2026-W48`). CPU-bound: run it in a thread."""
    policy = policy or ReportPolicy()
    year, number = parse_iso_week(week)
    start, end = week_bounds(year, number)
    week_records = [r for r in records if start <= r.recorded_at < end]
    # Escalation pairs are the unsure frames only: they would bias every comparison but the weighted one.
    pairing = pair_records(
        [r for r in week_records if r.selection != "escalation"], "thinking_on", "thinking_off"
    )
    every_pair = pair_records(week_records, "thinking_on", "thinking_off")
    rerun = pair_records(week_records, "thinking_on", "thinking_on_rerun", skip_reused_candidates=True)
    arms = Counter(r.arm for r in week_records)
    comparison = compare(pairing.pairs, policy) if pairing.pairs else None
    report = WeeklyReport(
        week=format_iso_week(year, number),
        week_start=start,
        week_end=end,
        generated_at=generated_at or datetime.now(UTC),
        policy=policy,
        recommendation=Recommendation(decision="no_data", title="", headline="", details=[]),
        comparison=comparison,
        noise_floor=compare(rerun.pairs, policy) if rerun.pairs else None,
        format_comparisons=[
            compare(pairs, policy)
            for reference, candidate in FORMAT_COMPARISONS
            if (pairs := pair_records(week_records, reference, candidate).pairs)
        ],
        categories=category_rows(pairing.pairs, policy) if pairing.pairs else [],
        tenants=tenant_rows(pairing.pairs, policy) if pairing.pairs else [],
        costs=arm_costs(week_records),
        human=human_scores(pairing.pairs, policy),
        sample_size=sample_size_needed(comparison, policy) if comparison else None,
        trend=[],
        data=DataNotes(
            records=len(week_records),
            records_by_arm={arm: arms.get(arm, 0) for arm in ARMS},
            records_by_source={str(k): v for k, v in Counter(r.source for r in week_records).items()},
            policy_versions=sorted({r.policy_version for r in week_records}),
            tenants=len({r.tenant for r in week_records}),
            unpaired_reference=pairing.unpaired_reference,
            unpaired_candidate=pairing.unpaired_candidate,
            duplicates=pairing.duplicates,
            reused_reruns=rerun.reused_candidates,
        ),
        escalation=threshold_section(
            every_pair.pairs,
            sample=policy.escalation_sample,
            always=policy.always_escalate,
            target=policy.escalation_target,
            resamples=policy.bootstrap_resamples,
            confidence=policy.confidence,
            seed=policy.seed,
        )
        if every_pair.pairs
        else None,
    )
    report.recommendation = recommend(report)
    earlier = sorted((s for s in previous if s.week < report.week), key=lambda s: s.week)
    report.trend = [*earlier, report.summary()]
    return report


def load_previous_summaries(directory: Path, week: str, limit: int = 12) -> list[WeekSummary]:
    """Summaries of up to `limit` earlier weeks from reports already written in `directory`."""
    summaries = []
    for path in sorted(directory.glob("quality-*.json")):
        label = path.stem.removeprefix("quality-")
        if label >= week:
            continue
        try:
            summaries.append(WeeklyReport.model_validate_json(path.read_text(encoding="utf-8")).summary())
        except (ValidationError, ValueError, OSError):
            logger.warning("skipping unreadable earlier report %s", path)
    return summaries[-limit:]


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path
    json: Path


def write_report(report: WeeklyReport, directory: Path) -> ReportFiles:
    """`quality-2026-W48.html`, `.md` and `.json` in `directory` (the JSON feeds later trends)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"quality-{report.week}"
    files = ReportFiles(
        html=stem.with_suffix(".html"), markdown=stem.with_suffix(".md"), json=stem.with_suffix(".json")
    )
    for path, text in (
        (files.html, render_html(report)),
        (files.markdown, render_markdown(report)),
        (files.json, render_json(report)),
    ):
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)  # readers never see half a report
    return files
