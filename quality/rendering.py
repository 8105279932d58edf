"""The weekly report as files an operator reads: one self-contained HTML page, Markdown and JSON."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader

from contracts.summaries import (
    ENGINE_NAMES,
    Coefficient,
    Estimate,
    Rate,
    ThresholdRow,
    ThresholdSection,
    WeeklyReport,
)
from quality import charts
from quality.notation import count, interval, pct, points, points_interval

__all__ = ["SHOWN_THRESHOLDS", "render_html", "render_json", "render_markdown", "shown_rows"]


def render_json(report: WeeklyReport) -> str:
    return report.model_dump_json(indent=2)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("quality", "templates"), autoescape=True, trim_blocks=True, lstrip_blocks=True
    )
    env.filters.update(
        pct=pct, interval=interval, count=count, points=points, points_interval=points_interval
    )
    return env


def render_html(report: WeeklyReport) -> str:
    """One self-contained HTML file: inline CSS, charts as base64 PNGs, no scripts, no network."""
    images: dict[str, str] = {}
    if report.comparison is not None:
        images["confusion"] = charts.png_data_uri(
            charts.confusion_chart(report.comparison, report.noise_floor)
        )
    if report.categories:
        images["categories"] = charts.png_data_uri(charts.category_chart(report.categories, report.policy))
    if any(s.agreement is not None for s in report.trend):
        images["trend"] = charts.png_data_uri(charts.trend_chart(report.trend, report.policy))
    if report.costs:
        images["costs"] = charts.png_data_uri(charts.cost_chart(report.costs))
    if report.labels is not None:
        images["labels"] = charts.png_data_uri(charts.label_chart(report.labels, report.policy))
    template = _environment().get_template("weekly_report.html.jinja")
    return template.render(
        report=report,
        images=images,
        arm_label=charts.ARM_LABELS,
        engine_label=ENGINE_NAMES,
        shown_rows=shown_rows,
    )


def _md_rate(rate: Rate | None) -> str:
    return "–" if rate is None else f"{pct(rate.value)} {interval(rate.low, rate.high)} (n={rate.n:,})"


def _md_coefficient(c: Coefficient) -> str:
    value = "–" if c.value is None else f"{c.value:.3f}"
    if c.low is None or c.high is None:
        return value
    return f"{value} [{c.low:.3f}, {c.high:.3f}]"


# rows of the threshold table a reader sees (the JSON has them all, with the quantile-based ones)
SHOWN_THRESHOLDS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99)


def shown_rows(section: ThresholdSection) -> list[ThresholdRow]:
    """The fixed grid's rows plus the recommended one, by threshold."""
    chosen = section.recommended.threshold if section.recommended else None
    return [row for row in section.rows if row.threshold in SHOWN_THRESHOLDS or row.threshold == chosen]


def _md_escalation(section: ThresholdSection | None) -> list[str]:
    if section is None:
        return []
    sample = (
        f"{section.pairs:,} random pairs"
        if section.sample == "random"
        else f"{section.pairs:,} pairs weighted by 1 / their chance of being paired "
        f"(effective {section.effective_pairs:,.0f})"
    )
    auroc = (
        "–"
        if section.auroc is None
        else (f"{section.auroc.value:.3f} [{section.auroc.low:.3f}, {section.auroc.high:.3f}]")
    )
    lines = [
        "",
        "## Escalation threshold",
        "",
        f"**{section.recommendation}**",
        "",
        f"From {sample} over {section.videos:,} videos; {section.escalation_pairs:,} escalation pairs "
        + ("left out (not a random sample)." if section.sample == "random" else "weighted in."),
        f"Thinking off alone disagrees on {pct(section.disagreement.value)} "
        f"{interval(section.disagreement.low, section.disagreement.high)}; AUROC of the fast verdict's "
        f"confidence against disagreement {auroc}. Always escalated: "
        f"{', '.join(section.always_escalate) or 'none'}, and every `review`.",
        "",
        "| escalate below | escalated | agreement with thinking on | disagreements re-asked |",
        "| --- | --- | --- | --- |",
    ]
    for row in shown_rows(section):
        lines.append(
            f"| {row.threshold:.3g} | {pct(row.escalated.value)} "
            f"{interval(row.escalated.low, row.escalated.high)} | {pct(row.agreement.value)} "
            f"{interval(row.agreement.low, row.agreement.high)} | "
            f"{pct(row.recovered)} |"
        )
    if section.without_confidence:
        lines.append(
            f"\n{section.without_confidence:,} fast verdicts had no confidence: they always escalate."
        )
    return lines


def render_markdown(report: WeeklyReport) -> str:
    rec = report.recommendation
    lines = [
        f"# Thinking-off quality, {report.week}",
        "",
        f"_{report.week_start:%d %b %Y} – {report.last_day:%d %b %Y} (UTC), generated "
        f"{report.generated_at:%Y-%m-%d %H:%M} UTC_",
        "",
        f"## {rec.title}",
        "",
        rec.headline,
        "",
    ]
    lines += [f"- {detail}" for detail in rec.details]
    comparison = report.comparison
    if comparison is not None:
        lines += [
            "",
            "## Agreement, thinking on vs thinking off",
            "",
            "| measure | value [95 % interval] |",
            "| --- | --- |",
            f"| raw agreement | {_md_rate(comparison.agreement)} |",
            f"| on frames thinking on flagged | {_md_rate(comparison.flagged_agreement)} |",
            f"| on frames thinking on left safe | {_md_rate(comparison.safe_agreement)} |",
            f"| same action (allow/review/block) | {_md_rate(comparison.action_agreement)} |",
            f"| Cohen's kappa | {_md_coefficient(comparison.kappa)} |",
            f"| PABAK | {_md_coefficient(comparison.pabak)} |",
            f"| Gwet's AC1 | {_md_coefficient(comparison.ac1)} |",
            f"| flagged only with thinking on / off | {comparison.mcnemar.reference_only:,} / "
            f"{comparison.mcnemar.candidate_only:,} (exact McNemar p = {comparison.mcnemar.p_value:.3g}) |",
            "",
            "Intervals are the union of the Wilson interval (frames independent) and a percentile "
            "bootstrap over whole videos (frames of one video are correlated).",
        ]
    if report.noise_floor is not None:
        lines += [
            "",
            f"Noise floor (thinking on vs its re-run): {_md_rate(report.noise_floor.agreement)}, "
            f"on flagged {_md_rate(report.noise_floor.flagged_agreement)}.",
        ]
    if report.format_comparisons:
        lines += [
            "",
            "## Verdict format",
            "",
            "| reference | candidate | frames | agreement | on flagged | action agreement | kappa |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {c.reference} | {c.candidate} | {c.frames:,} | {_md_rate(c.agreement)} | "
            f"{_md_rate(c.flagged_agreement)} | {_md_rate(c.action_agreement)} | {_md_coefficient(c.kappa)} |"
            for c in report.format_comparisons
        ]
    lines += _md_escalation(report.escalation)
    lines += _md_engines(report)
    if report.categories:
        lines += [
            "",
            "## By category",
            "",
            "| category | flagged (on / off) | agreement on flagged | verdict |",
            "| --- | --- | --- | --- |",
        ]
        for row in report.categories:
            verdict = (
                "too few to judge"
                if not row.judged
                else "below minimum"
                if row.below_threshold
                else "interval reaches below minimum"
                if row.unsettled
                else "ok"
            )
            lines.append(
                f"| {row.category} | {row.reference_flagged:,} / {row.candidate_flagged:,} | "
                f"{_md_rate(row.flagged_agreement)} | {verdict} |"
            )
    if report.tenants:
        lines += [
            "",
            "## By tenant",
            "",
            "| tenant | frames | agreement | on flagged |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {row.tenant} | {row.frames:,} | {_md_rate(row.agreement)} "
            f"| {_md_rate(row.flagged_agreement)} |"
            for row in report.tenants
        ]
    if report.human:
        lines += [
            "",
            "## Against human labels",
            "",
            "| arm | frames | accuracy | precision | recall |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {s.arm} | {s.frames:,} | {_md_rate(s.accuracy)} | {_md_rate(s.precision)} | "
            f"{_md_rate(s.recall)} |"
            for s in report.human
        ]
    lines += _md_labels(report)
    if report.costs:
        lines += [
            "",
            "## Cost per arm",
            "",
            "| arm | frames | latency p50 / p90 / p99 | TTFT p50 | prompt (cached) "
            "| completion (reasoning) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for cost in report.costs:
            ttft = "–" if cost.ttft_p50_ms is None else f"{cost.ttft_p50_ms:.0f} ms"
            lines.append(
                f"| {cost.arm} | {cost.frames:,} | {cost.latency_p50_ms / 1000:.2f} / "
                f"{cost.latency_p90_ms / 1000:.2f}"
                f" / {cost.latency_p99_ms / 1000:.2f} s | {ttft} | {cost.mean_prompt_tokens:.0f} "
                f"({cost.mean_cached_tokens:.0f}) | {cost.mean_completion_tokens:.0f} "
                f"({cost.mean_reasoning_tokens:.0f}) |"
            )
    if len(report.trend) > 1:
        lines += [
            "",
            "## Trend",
            "",
            "| week | frames | agreement | on flagged | noise floor | decision |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {s.week} | {s.frames:,} | {pct(s.agreement)} | {pct(s.flagged_agreement)} | "
            f"{pct(s.noise_floor)} | {s.decision} |"
            for s in report.trend
        ]
    data = report.data
    lines += [
        "",
        "## Data",
        "",
        f"{data.records:,} records: "
        + ", ".join(f"{arm} {n:,}" for arm, n in data.records_by_arm.items())
        + "; sources "
        + (", ".join(f"{source} {n:,}" for source, n in data.records_by_source.items()) or "none")
        + "; policy versions "
        + (", ".join(str(v) for v in data.policy_versions) or "none")
        + f"; {data.duplicates:,} repeated verdicts "
        "ignored (first per frame and arm kept).",
        "",
    ]
    return "\n".join(lines)


def _md_estimate(estimate: Estimate) -> str:
    return f"{pct(estimate.value)} [{pct(estimate.low)}, {pct(estimate.high)}]"


def _md_labels(report: WeeklyReport) -> list[str]:
    """Accuracy against the decision log's labels, the threshold's source, and each tenant's decisions."""
    lines: list[str] = []
    section = report.labels
    if section is not None:
        lines += ["", "## Against people's labels (decision log)", "",
                  "Each label weighs what it stands for: an audit sample at rate r, 1/r decisions; an item "
                  "queued for a review verdict or a low confidence, 1. Interval: Wilson on Kish's effective "
                  "number of labels.", "",
                  "| arm | engine | labels | effective | accuracy |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {row.arm} | {row.engine} | {row.labels:,} | {row.effective_labels:.1f} | "
                  f"{_md_estimate(row.accuracy)} |" for row in section.arms]
        if section.categories:
            lines += ["", "| arm | engine | category | labels | accuracy |",
                      "| --- | --- | --- | --- | --- |"]
            lines += [f"| {row.arm} | {row.engine} | {row.category} | {row.labels:,} | "
                      f"{_md_estimate(row.accuracy)} |" for row in section.categories]
        lines += ["", f"**{section.threshold.note}**"]
    if report.tenant_decisions:
        lines += ["", "## Decisions by tenant (decision log)", "",
                  "| tenant | decisions | blocked | answered review | labelled | labels agreeing |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [
            f"| {row.tenant} | {row.decisions:,} | {_md_rate(row.block_rate)} | "
            f"{'–' if row.review_share is None else pct(row.review_share)} | {row.labelled:,} | "
            f"{'–' if row.label_agreement is None else pct(row.label_agreement)} |"
            for row in report.tenant_decisions
        ]
    return lines


def _md_engines(report: WeeklyReport) -> list[str]:
    section = report.engines
    if section is None:
        return []
    a = ENGINE_NAMES.get(section.reference_engine, section.reference_engine)
    b = ENGINE_NAMES.get(section.candidate_engine, section.candidate_engine)
    lines = [
        "",
        f"## Engines: {b} against {a}",
        "",
        section.headline,
        "",
        f"| arm | frames | agreement | on flagged | kappa | {b} latency p50 | {b} completion tokens |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for item in section.comparisons:
        c, cost = item.comparison, item.candidate_cost
        latency = "–" if cost is None else f"{cost.latency_p50_ms / 1000:.2f} s"
        tokens = "–" if cost is None else f"{cost.mean_completion_tokens:.0f}"
        lines.append(
            f"| {item.arm} | {c.frames:,} | {_md_rate(c.agreement)} | {_md_rate(c.flagged_agreement)} | "
            f"{_md_coefficient(c.kappa)} | {latency} | {tokens} |"
        )
    return lines
