"""The weekly report: the recommendation, edge cases, and the three renderings."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts.records import VerdictRecord
from quality.report import (
    ReportPolicy,
    WeeklyReport,
    build_weekly_report,
    load_previous_summaries,
    render_html,
    render_json,
    render_markdown,
    write_report,
)
from tests.quality.fakes import synthesize_week

FAST = ReportPolicy(bootstrap_resamples=400)
GENERATED = datetime(2026, 11, 30, 6, 15, tzinfo=UTC)


def report_for(
    records: list[VerdictRecord], policy: ReportPolicy = FAST, week: str = "2026-W48"
) -> WeeklyReport:
    return build_weekly_report(records, week, policy, generated_at=GENERATED)


def test_a_close_agreement_meets_policy() -> None:
    # enough flagged frames that every category's interval clears the flagged minimum too (about 100 each)
    week = synthesize_week(
        frames=4000, videos=400, flag_rate=0.12, flip_on_flagged=0.01, flip_on_safe=0.001, seed=1
    )
    report = report_for(week.records)
    assert report.recommendation.decision == "thinking_off_ok"
    assert report.recommendation.title == "Thinking off meets policy"
    assert "both intervals clear the policy minimums" in report.recommendation.headline


def test_a_clear_drop_keeps_thinking_on_and_says_by_how_much() -> None:
    week = synthesize_week(frames=3000, videos=300, flip_on_flagged=0.25, flip_on_safe=0.04, seed=2)
    report = report_for(week.records)
    assert report.recommendation.decision == "keep_thinking_on"
    comparison = report.comparison
    assert comparison is not None
    headline = report.recommendation.headline
    assert headline.endswith("Keep thinking on.")
    # the numbers an operator acts on, with their intervals, are in the sentence itself
    assert re.search(
        r"agrees \d+\.\d % \[\d+\.\d, \d+\.\d\] with thinking on over 3,000 frames from \d+ videos", headline
    )
    assert f"{comparison.agreement.value * 100:.1f} %" in headline
    assert "frames thinking on flagged" in headline
    assert any(detail.startswith("Thinking off flags more") for detail in report.recommendation.details)


def test_a_small_sample_near_the_threshold_is_inconclusive_and_says_how_many_frames_would_settle_it() -> None:
    week = synthesize_week(
        frames=400, videos=40, flip_on_flagged=0.0, flip_on_safe=0.02, flag_rate=0.1, seed=3
    )
    report = report_for(week.records, ReportPolicy(bootstrap_resamples=400, min_agreement=0.975))
    assert report.recommendation.decision == "inconclusive"
    assert re.search(r"until about [\d,]+ paired frames settle it\.$", report.recommendation.headline)


def test_a_week_without_records_says_so_and_still_renders(tmp_path: Path) -> None:
    report = report_for([])
    assert report.recommendation.decision == "no_data"
    assert report.recommendation.headline.startswith("No quality records for 2026-W48")
    files = write_report(report, tmp_path)
    assert "No quality records for 2026-W48" in files.html.read_text()
    assert "No quality records" in files.markdown.read_text()
    assert WeeklyReport.model_validate_json(files.json.read_text()).comparison is None


def test_a_week_with_only_one_arm_says_which_arm_is_missing() -> None:
    records = [r for r in synthesize_week(frames=200, videos=20).records if r.arm == "thinking_on"]
    report = report_for(records)
    assert report.recommendation.decision == "no_data"
    assert "records came only from thinking on (200)" in report.recommendation.headline
    assert [cost.arm for cost in report.costs] == ["thinking_on"]
    assert "thinking on" in render_html(report)


def test_records_outside_the_week_are_ignored() -> None:
    inside = synthesize_week(frames=300, videos=30, seed=4).records
    outside = synthesize_week(frames=300, videos=30, seed=5, week=47).records
    report = report_for([*inside, *outside])
    assert report.data.records == len(inside)


def test_categories_below_the_flagged_minimum_are_named() -> None:
    week = synthesize_week(frames=6000, videos=600, flag_rate=0.08, flip_on_flagged=0.3, seed=6)
    report = report_for(week.records)
    failing = [row.category for row in report.categories if row.below_threshold]
    assert failing
    assert any(
        detail.startswith("Keep thinking on for categories below the flagged minimum")
        and failing[0] in detail
        for detail in report.recommendation.details
    )


def test_the_noise_floor_comes_from_fresh_reruns_only() -> None:
    week = synthesize_week(frames=2000, videos=200, rerun_fraction=0.2, rerun_flip=0.01, seed=8)
    report = report_for(week.records)
    assert report.noise_floor is not None
    assert report.noise_floor.candidate == "thinking_on_rerun"
    assert report.comparison is not None
    assert report.noise_floor.agreement.value > report.comparison.agreement.value
    assert any(detail.startswith("Noise floor:") for detail in report.recommendation.details)


def test_human_labels_give_accuracy_precision_and_recall_per_arm() -> None:
    week = synthesize_week(frames=3000, videos=300, labels_fraction=0.3, seed=9)
    report = report_for(week.records)
    assert [score.arm for score in report.human] == ["thinking_on", "thinking_off"]
    on = report.human[0]
    assert on.recall is not None
    assert on.frames == pytest.approx(900, rel=0.15)
    assert on.accuracy.wilson_low < on.accuracy.value < on.accuracy.wilson_high


def test_costs_per_arm_show_what_thinking_costs() -> None:
    report = report_for(synthesize_week(frames=1000, videos=100, seed=10).records)
    costs = {cost.arm: cost for cost in report.costs}
    assert costs["thinking_on"].latency_p50_ms == pytest.approx(8560, rel=0.05)
    assert costs["thinking_off"].latency_p50_ms == pytest.approx(620, rel=0.1)
    assert costs["thinking_on"].mean_reasoning_tokens > 80
    assert costs["thinking_off"].mean_reasoning_tokens == 0
    assert len(costs["thinking_on"].latency_quantiles_ms) == 101


def test_the_html_is_one_self_contained_file() -> None:
    report = report_for(synthesize_week(frames=1500, videos=150, rerun_fraction=0.1, seed=11).records)
    html = render_html(report)
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["'](?!data:)""", html), "everything must be inline"
    assert "http://" not in html
    assert "https://" not in html
    assert html.count('src="data:image/png;base64,') == 4  # confusion, categories, trend, costs
    assert report.recommendation.headline.replace("'", "&#39;") in html


def test_markdown_leads_with_the_recommendation() -> None:
    report = report_for(synthesize_week(frames=800, videos=80, seed=12).records)
    markdown = render_markdown(report)
    lines = markdown.splitlines()
    assert lines[0] == "# Thinking-off quality, 2026-W48"
    assert lines[4] == f"## {report.recommendation.title}"
    assert lines[6] == report.recommendation.headline
    assert "| Gwet's AC1 |" in markdown


def test_json_round_trips_and_feeds_the_next_weeks_trend(tmp_path: Path) -> None:
    for number, seed in ((46, 20), (47, 21)):
        earlier = report_for(
            synthesize_week(week=number, frames=500, videos=50, seed=seed).records, week=f"2026-W{number}"
        )
        write_report(earlier, tmp_path)
    current = report_for(synthesize_week(frames=500, videos=50, seed=22).records)
    assert WeeklyReport.model_validate_json(render_json(current)) == current
    previous = load_previous_summaries(tmp_path, "2026-W48")
    assert [s.week for s in previous] == ["2026-W46", "2026-W47"]
    with_trend = build_weekly_report(
        synthesize_week(frames=500, videos=50, seed=22).records, "2026-W48", FAST, previous, GENERATED
    )
    assert [s.week for s in with_trend.trend] == ["2026-W46", "2026-W47", "2026-W48"]
    assert with_trend.comparison is not None
    assert with_trend.trend[-1].agreement == with_trend.comparison.agreement.value
