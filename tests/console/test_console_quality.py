"""The newest weekly quality report, as the console reads and shows it."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import httpx

from cli.embedded import ThreadedServer
from gateway.http.console.sessions import latest_quality_headline
from quality.report import ReportPolicy, build_weekly_report, write_report
from tests.quality.fakes import synthesize_week
from tests.support import ADMIN_TOKEN, GatewayFactory

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def minimal_report(directory: Path, week: str, title: str) -> None:
    """A report file with only the fields the console reads (the rest of the schema is ignored)."""
    directory.mkdir(parents=True, exist_ok=True)
    body = {
        "week": week,
        "generated_at": "2026-11-30T06:15:00Z",
        "recommendation": {
            "decision": "inconclusive",
            "title": title,
            "headline": f"{title}.",
            "details": [],
        },
        "trend": [{"week": week, "frames": 100, "agreement": 0.98}],
    }
    (directory / f"quality-{week}.json").write_text(json.dumps(body), encoding="utf-8")


def test_no_directory_means_no_report_yet(tmp_path: Path) -> None:
    assert latest_quality_headline(tmp_path / "missing") is None


def test_the_newest_iso_week_wins_not_the_newest_file(tmp_path: Path) -> None:
    minimal_report(tmp_path, "2026-W48", "Week 48")
    minimal_report(tmp_path, "2026-W47", "Week 47")  # written later: a re-run of an older week
    (tmp_path / "notes.json").write_text("{}", encoding="utf-8")
    headline = latest_quality_headline(tmp_path)
    assert headline is not None
    assert (headline.week, headline.title) == ("2026-W48", "Week 48")
    assert headline.figures is not None
    assert headline.figures.agreement == 0.98
    assert headline.html_report is None


def test_an_unreadable_newer_report_is_skipped_and_named(tmp_path: Path) -> None:
    minimal_report(tmp_path, "2026-W47", "Week 47")
    (tmp_path / "quality-2026-W48.json").write_text('{"week": "2026-W48"', encoding="utf-8")
    headline = latest_quality_headline(tmp_path)
    assert headline is not None
    assert headline.week == "2026-W47"
    assert headline.skipped == ["quality-2026-W48.json"]


def test_a_report_written_by_the_quality_module_gives_its_recommendation_and_figures(tmp_path: Path) -> None:
    week = synthesize_week(frames=600, videos=50, rerun_fraction=0.15, labels_fraction=0.1, seed=7)
    report = build_weekly_report(
        week.records,
        "2026-W48",
        ReportPolicy(bootstrap_resamples=200),
        [],
        generated_at=datetime(2026, 11, 30, 6, 15, tzinfo=UTC),
    )
    write_report(report, tmp_path)
    headline = latest_quality_headline(tmp_path)
    assert headline is not None
    recommendation = report.recommendation
    assert (headline.decision, headline.title) == (recommendation.decision, recommendation.title)
    assert headline.headline == report.recommendation.headline
    assert headline.figures is not None
    assert report.comparison is not None
    assert headline.figures.agreement == report.comparison.agreement.value
    assert headline.figures.frames == report.comparison.frames
    assert set(headline.costs) >= {"thinking_on", "thinking_off"}
    assert headline.html_report == tmp_path / "quality-2026-W48.html"


def test_the_console_says_no_report_yet(
    start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path
) -> None:
    gateway = start_gateway(engine_url=sim.url, console={"reports_dir": str(tmp_path / "reports")})
    panel = httpx.get(f"{gateway.url}/console/panels", headers=ADMIN).json()["panels"]["quality"]
    assert "No report yet" in panel
    assert httpx.get(f"{gateway.url}/console/quality/latest", headers=ADMIN).status_code == 404


def test_the_console_shows_the_newest_report_and_serves_its_html(
    start_gateway: GatewayFactory, sim: ThreadedServer, tmp_path: Path
) -> None:
    minimal_report(tmp_path, "2026-W48", "Not enough evidence yet")
    html = "<html><body>the full report</body></html>"
    (tmp_path / "quality-2026-W48.html").write_text(html, encoding="utf-8")
    gateway = start_gateway(engine_url=sim.url, console={"reports_dir": str(tmp_path)})
    panel = httpx.get(f"{gateway.url}/console/panels", headers=ADMIN).json()["panels"]["quality"]
    assert re.search(r'id="quality-decision">Not enough evidence yet<', panel), panel
    assert "98.0 %" in panel
    assert httpx.get(f"{gateway.url}/console/quality/latest").status_code == 401
    full = httpx.get(f"{gateway.url}/console/quality/latest", headers=ADMIN)
    assert full.status_code == 200
    assert "the full report" in full.text
    assert "script-src" not in full.headers["content-security-policy"]  # no script may run in it
