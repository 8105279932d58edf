"""The weekly quality report: what turning thinking off costs in verdicts, led by a recommendation.

`build_weekly_report` is plain CPU work over a list of records (call it from a thread in a server);
`render_html`, `render_markdown` and `render_json` turn the result into files an operator reads.

This module assembles the report and is its public surface. The parts, each one job: the models in
:mod:`contracts.summaries` (light: the console reads reports through them), the sections computed in
:mod:`quality.sections` and :mod:`quality.escalation`, the recommendation in :mod:`quality.recommendation`,
the rendering in :mod:`quality.rendering` (charts from :mod:`quality.charts`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pydantic import ValidationError

from contracts.decisions import DecisionRow
from contracts.records import ARMS, VerdictRecord, format_iso_week, parse_iso_week, week_bounds
from contracts.summaries import (
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
from quality.columnar import records_table
from quality.columns import run_bootstrap
from quality.recommendation import recommend
from quality.week_stage import FORMAT_COMPARISONS, WeekTables, limit_malloc_arenas, week_tables

__all__ = [
    "FORMAT_COMPARISONS",
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
    "build_weekly_report_from",
    "limit_malloc_arenas",
    "load_previous_summaries",
    "render_html",
    "render_json",
    "render_markdown",
    "write_report",
]

logger = logging.getLogger(__name__)


def build_weekly_report(
    records: Iterable[VerdictRecord],
    week: str,
    policy: ReportPolicy | None = None,
    previous: Sequence[WeekSummary] = (),
    generated_at: datetime | None = None,
) -> WeeklyReport:
    """Everything the report says about one ISO week (`2026-W48`). CPU-bound: run it in a thread.

    The records go into arrow batches a slice at a time and the report is computed over those columns
    (`build_weekly_report_from`), so no more than a batch of them is ever held as objects.
    """
    return build_weekly_report_from(records_table(records), week, policy, previous, generated_at)


def build_weekly_report_from(
    source: Path | pa.Table,
    week: str,
    policy: ReportPolicy | None = None,
    previous: Sequence[WeekSummary] = (),
    generated_at: datetime | None = None,
    *,
    only_source: str | None = None,
    isolate: bool | None = None,
    decisions: Sequence[DecisionRow] | None = None,
) -> WeeklyReport:
    """The report from columns: a folder of Parquet files (a week's partition) or an arrow table.

    `only_source` keeps one source of records (`shadow` or `offline`). The queries run in a process of
    their own for a folder (`isolate`, see `quality.week_stage.week_tables`), in this one for a table.
    `decisions`: the decision log's rows of the week (its labels score the arms against people, its
    decisions give each tenant's block rate); None: no log was read."""
    policy = policy or ReportPolicy()
    year, number = parse_iso_week(week)
    start, end = week_bounds(year, number)
    label = format_iso_week(year, number)
    # handed over in a list `_build` empties, no name here holding them: it lets go of the escalation
    # sample once its plan has what it needs (at ten million pairs, 180 MB kept through the bootstrap)
    tables = [week_tables(source, start, end, policy, only_source=only_source, isolate=isolate)]
    report = _build(tables, policy, label, (start, end), previous, generated_at)
    if decisions is not None:
        _add_decisions(report, source, [row for row in decisions if start <= row.decided_at < end], policy)
        report.recommendation = recommend(report)
        if report.labels is not None:
            from quality.labels import label_headline

            line = label_headline(report.labels)
            report.recommendation.headline += " " + line
            report.recommendation.details.append(line)
        report.trend[-1] = report.summary()
    return report


def _add_decisions(report: WeeklyReport, source: Path | pa.Table, rows: list[DecisionRow],
                   policy: ReportPolicy) -> None:
    """The decision log's part: accuracy against labels per arm, the threshold's source, tenants' blocks."""
    from quality.labels import label_section, labelled_from_log, labelled_pairs, tenant_decision_rows

    labelled = labelled_from_log(rows)
    frames = {item.frame_sha256 for item in labelled if item.frame_sha256}
    pairs = labelled_pairs(labelled, _verdicts_of(source, frames), policy.always_escalate)
    report.labels = label_section(labelled, pairs, report.escalation, policy)
    report.tenant_decisions = tenant_decision_rows(rows, policy.confidence)


def _verdicts_of(
    source: Path | pa.Table, frames: set[str]
) -> dict[str, dict[str, tuple[str, tuple[str, ...], float | None, float | None]]]:
    """The week's thinking-off and thinking-on verdicts of these frames (the first of each arm)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if not frames:
        return {}
    columns = [
        "frame_sha256", "arm", "action", "categories", "confidence", "selection_probability", "recorded_at"
    ]
    wanted = pc.field("frame_sha256").isin(sorted(frames)) & pc.field("arm").isin(
        ["thinking_off", "thinking_on"]
    )
    table = (source if isinstance(source, pa.Table) else ds.dataset(source, format="parquet").to_table(
        columns=columns, filter=wanted))
    if isinstance(source, pa.Table):
        table = table.select(columns).filter(wanted)
    found: dict[str, dict[str, tuple[str, tuple[str, ...], float | None, float | None]]] = {}
    for row in table.sort_by("recorded_at").to_pylist():
        arms = found.setdefault(row["frame_sha256"], {})
        arms.setdefault(row["arm"], (row["action"], tuple(row["categories"] or ()), row["confidence"],
                                     row["selection_probability"]))
    return found


def _build(
    holder: list[WeekTables],
    policy: ReportPolicy,
    week: str,
    bounds: tuple[datetime, datetime],
    previous: Sequence[WeekSummary],
    generated_at: datetime | None,
) -> WeeklyReport:
    # the statistics (scikit-learn, statsmodels, scipy) come in once the week's tables are here: while
    # the SQL stage's process runs, this one holds only the light modules (about 70 MB less at once)
    from quality.engines import engine_comparison_plans, engine_section
    from quality.escalation import ThresholdPlan
    from quality.sections import CategoryPlan, ComparisonPlan, TenantPlan, human_scores, sample_size_needed

    tables = holder.pop()  # the only reference: `del tables` below frees the escalation sample
    counts, main, pairing, engine = tables.counts, tables.main, tables.pairing, tables.engine
    rerun, rerun_notes, every_pair = tables.rerun, tables.rerun_notes, tables.escalation
    plans: list[ComparisonPlan | CategoryPlan | TenantPlan | ThresholdPlan] = []
    comparison_plan = ComparisonPlan(main, policy) if len(main) else None
    rerun_plan = ComparisonPlan(rerun, policy) if len(rerun) else None
    format_plans = [ComparisonPlan(cols, policy) for cols in tables.formats]
    category_plan = CategoryPlan(main, policy) if len(main) else None
    tenant_plan = TenantPlan(main, policy) if len(main) else None
    engine_plans = engine_comparison_plans(tables.engines, tables.engine, policy)
    costs = tables.costs
    threshold_plan = (
        ThresholdPlan(
            every_pair,
            sample=policy.escalation_sample,
            always=policy.always_escalate,
            target=policy.escalation_target,
            resamples=policy.bootstrap_resamples,
            confidence=policy.confidence,
            seed=policy.seed,
        )
        if every_pair.size
        else None
    )
    # the plan keeps what its bootstrap needs of the sample's frames, not the frames
    del every_pair, tables
    for plan in (comparison_plan, rerun_plan, *format_plans, category_plan, tenant_plan, threshold_plan):
        if plan is not None:
            plans.append(plan)
    plans.extend(p for _, p in engine_plans)
    run_bootstrap(group for plan in plans for group in plan.groups())

    comparison = comparison_plan.result() if comparison_plan else None
    start, end = bounds
    report = WeeklyReport(
        week=week,
        week_start=start,
        week_end=end,
        generated_at=generated_at or datetime.now(UTC),
        policy=policy,
        recommendation=Recommendation(decision="no_data", title="", headline="", details=[]),
        comparison=comparison,
        noise_floor=rerun_plan.result() if rerun_plan else None,
        format_comparisons=[plan.result() for plan in format_plans],
        categories=category_plan.result() if category_plan else [],
        tenants=tenant_plan.result() if tenant_plan else [],
        costs=costs,
        human=human_scores(main, policy) if len(main) else [],
        sample_size=sample_size_needed(comparison, policy) if comparison else None,
        trend=[],
        data=DataNotes(
            records=counts.records,
            records_by_arm={arm: counts.by_arm.get(arm, 0) for arm in ARMS},
            records_by_source=counts.by_source,
            policy_versions=counts.policy_versions,
            tenants=counts.tenants,
            unpaired_reference=pairing["unpaired_reference"],
            unpaired_candidate=pairing["unpaired_candidate"],
            duplicates=pairing["duplicates"],
            reused_reruns=rerun_notes["reused_candidates"],
        ),
        escalation=threshold_plan.result() if threshold_plan else None,
    )
    report.engines = engine_section(engine_plans, engine, policy)
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


def render_json(report: WeeklyReport) -> str:
    """The report as JSON (`quality.rendering.render_json`; later weeks' trend reads it back)."""
    from quality import rendering  # matplotlib and jinja: imported when a report is written

    return rendering.render_json(report)


def render_html(report: WeeklyReport) -> str:
    """The report as one HTML page with its charts inline (`quality.rendering.render_html`)."""
    from quality import rendering

    return rendering.render_html(report)


def render_markdown(report: WeeklyReport) -> str:
    """The report as Markdown (`quality.rendering.render_markdown`)."""
    from quality import rendering

    return rendering.render_markdown(report)


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
