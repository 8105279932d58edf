"""A headline that agrees with its tables: crafted weeks where all, one or no category fails the minimum."""

from __future__ import annotations

from datetime import timedelta

import pytest

from contracts.records import VerdictRecord, week_bounds
from quality.charts import agreement_axis_floor, category_chart
from quality.report import ReportPolicy, WeeklyReport, build_weekly_report

CATEGORIES = ("sexual", "violence", "self-harm", "hate", "illicit", "weapons")
POLICY = ReportPolicy(bootstrap_resamples=200)


def _record(index: int, arm: str, flagged: bool, category: str | None, video: int) -> VerdictRecord:
    start, _ = week_bounds(2026, 48)
    return VerdictRecord(
        frame_sha256=f"{index:064x}",
        video_id=f"video-{video}",
        tenant="acme",
        arm=arm,  # type: ignore[arg-type]  # thinking_on or thinking_off
        action="block" if flagged else "allow",
        flagged=flagged,
        categories=[category] if flagged and category else [],
        policy_version=1,
        prompt_tokens=1076,
        cached_tokens=416,
        completion_tokens=95 if arm == "thinking_on" else 5,
        reasoning_tokens=88 if arm == "thinking_on" else 0,
        latency_ms=8560.0 if arm == "thinking_on" else 620.0,
        recorded_at=start + timedelta(minutes=index),
        source="offline",
        request_id=f"{arm}-{index}",
    )


def crafted_week(
    failing: set[str], *, flagged_per_category: int = 80, safe: int = 4000, renamed_of_20: int = 17
) -> list[VerdictRecord]:
    """Thinking off flags exactly the frames thinking on flags (overall flagged agreement 100 %), but names
    the next category instead for `renamed_of_20` of every 20 frames (85 %) of each category in `failing`."""
    records: list[VerdictRecord] = []
    index = 0
    for position, category in enumerate(CATEGORIES):
        renamed = CATEGORIES[(position + 1) % len(CATEGORIES)]
        for k in range(flagged_per_category):
            other = category in failing and k % 20 < renamed_of_20
            video = index // 8
            records.append(_record(index, "thinking_on", True, category, video))
            records.append(_record(index, "thinking_off", True, renamed if other else category, video))
            index += 1
    for _ in range(safe):
        video = index // 8
        records.append(_record(index, "thinking_on", False, None, video))
        records.append(_record(index, "thinking_off", False, None, video))
        index += 1
    return records


def _report(failing: set[str]) -> WeeklyReport:
    return build_weekly_report(crafted_week(failing), "2026-W48", POLICY)


def test_when_every_category_fails_the_flagged_minimum_the_headline_keeps_thinking_on() -> None:
    report = _report(set(CATEGORIES))
    comparison = report.comparison
    assert comparison is not None
    assert comparison.flagged_agreement is not None
    # the overall figures alone would pass: 100 % of flagged frames flagged, 100 % agreement
    assert comparison.agreement.low >= POLICY.min_agreement
    assert comparison.flagged_agreement.low >= POLICY.min_flagged_agreement
    assert all(row.below_threshold for row in report.categories)
    headline = report.recommendation.headline
    print(f"\nall failing: {report.recommendation.title}: {headline}")
    assert report.recommendation.decision == "keep_thinking_on"
    assert "every category judged (6) is below the 90 % flagged minimum" in headline
    assert "meets policy" not in report.recommendation.title
    assert "can be turned off" not in headline


def test_when_one_category_fails_the_headline_names_it_and_keeps_thinking_on() -> None:
    report = _report({"hate"})
    failing = [row.category for row in report.categories if row.below_threshold]
    assert failing == ["hate"]
    headline = report.recommendation.headline
    print(f"\none failing: {report.recommendation.title}: {headline}")
    assert report.recommendation.decision == "keep_thinking_on"
    assert "1 of 6 categories judged are below the 90 % flagged minimum (hate 15.0 %)" in headline


def test_when_no_category_fails_and_every_interval_clears_thinking_off_meets_policy() -> None:
    report = _report(set())
    assert not any(row.below_threshold for row in report.categories)
    headline = report.recommendation.headline
    print(f"\nnone failing: {report.recommendation.title}: {headline}")
    assert report.recommendation.decision == "thinking_off_ok"
    assert "and every category judged (6) meets the flagged minimum" in headline


@pytest.mark.parametrize("failing", [set(CATEGORIES), {"hate"}, set()])
def test_the_category_chart_axis_reaches_below_every_interval_its_table_lists(failing: set[str]) -> None:
    report = _report(failing)
    lows = [row.flagged_agreement.low for row in report.categories if row.flagged_agreement]
    assert len(lows) == len(report.categories) == 6
    floor = agreement_axis_floor(lows, POLICY.min_flagged_agreement)
    assert 0.0 <= floor <= min(lows)
    assert floor <= POLICY.min_flagged_agreement
    assert category_chart(report.categories, POLICY).startswith(b"\x89PNG")


def test_the_axis_floor_for_the_issue_week_shows_sixteen_percent() -> None:
    assert agreement_axis_floor([0.16, 0.17, 0.15], 0.9) == pytest.approx(0.1)
    assert agreement_axis_floor([0.93, 0.95], 0.9) == pytest.approx(0.85)


def test_a_category_whose_interval_reaches_below_the_minimum_keeps_the_headline_from_meeting_policy() -> None:
    """76 of 80 (95 %) is above the 90 % minimum, but its interval reaches 87.8 %: the overall figure in that
    state is "not enough evidence yet", and so is a category."""
    report = build_weekly_report(crafted_week({"hate"}, renamed_of_20=1), "2026-W48", POLICY)
    hate = next(row for row in report.categories if row.category == "hate")
    assert hate.flagged_agreement is not None
    assert hate.flagged_agreement.value == 0.95
    assert hate.flagged_agreement.low < POLICY.min_flagged_agreement
    assert not hate.below_threshold
    assert hate.unsettled
    recommendation = report.recommendation
    print(f"\nunsettled: {recommendation.title}: {recommendation.headline}")
    assert recommendation.decision == "inconclusive"
    assert "the interval of 1 of 6 categories judged still reaches below the 90 % flagged minimum (hate" in (
        recommendation.headline
    )
    assert "can be turned off" not in recommendation.headline


def test_a_week_with_no_judgeable_category_says_it_cannot_judge_never_that_it_meets_policy() -> None:
    policy = ReportPolicy(bootstrap_resamples=200, min_category_flagged=100)
    report = build_weekly_report(crafted_week(set()), "2026-W48", policy)
    comparison = report.comparison
    assert comparison is not None
    assert comparison.flagged_agreement is not None
    assert comparison.flagged_agreement.low >= policy.min_flagged_agreement  # the overall figure passes
    assert not any(row.judged for row in report.categories)
    recommendation = report.recommendation
    print(f"\nno category judgeable: {recommendation.title}: {recommendation.headline}")
    assert recommendation.decision == "inconclusive"
    assert "no category has the 100 flagged frames it needs to be judged" in recommendation.headline
    assert "meets policy" not in recommendation.title
    assert "can be turned off" not in recommendation.headline
