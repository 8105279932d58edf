"""The weekly report in a real browser: no console errors, no network, and a screenshot to look at."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from quality.report import ReportPolicy, WeekSummary, build_weekly_report, write_report
from tests.browser import ARTIFACTS, chromium_page
from tests.quality.fakes import synthesize_week


def earlier_weeks() -> list[WeekSummary]:
    """Eight earlier weeks, as loaded from their JSON reports, for the trend chart."""
    return [
        WeekSummary(
            week=f"2026-W{number}",
            frames=3800 + 40 * number,
            agreement=0.972 + 0.002 * (number % 3),
            agreement_low=0.966 + 0.002 * (number % 3),
            agreement_high=0.978 + 0.002 * (number % 3),
            flagged_frames=110,
            flagged_agreement=0.87 + 0.01 * (number % 4),
            flagged_agreement_low=0.80 + 0.01 * (number % 4),
            flagged_agreement_high=0.93 + 0.01 * (number % 4),
            noise_floor=0.993,
            noise_floor_low=0.988,
            noise_floor_high=0.996,
            decision="keep_thinking_on",
        )
        for number in range(40, 48)
    ]


@pytest.mark.browser
def test_the_weekly_report_opens_in_chromium_without_errors(tmp_path: Path) -> None:
    week = synthesize_week(frames=4210, videos=312, rerun_fraction=0.15, labels_fraction=0.1, seed=48)
    report = build_weekly_report(
        week.records,
        "2026-W48",
        ReportPolicy(),
        earlier_weeks(),
        generated_at=datetime(2026, 11, 30, 6, 15, tzinfo=UTC),
    )
    files = write_report(report, tmp_path)

    with chromium_page(1200, 900) as watched:
        page = watched.page
        page.goto(files.html.as_uri(), wait_until="load")
        images = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
        headline = page.inner_text(".headline")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "quality-report.png"), full_page=True)

    assert watched.problems == []
    assert all(url.startswith(("file:", "data:")) for url in watched.requests), watched.requests
    assert images == [True, True, True, True]
    assert headline == report.recommendation.headline
    assert (ARTIFACTS / "quality-report.png").stat().st_size > 50_000
