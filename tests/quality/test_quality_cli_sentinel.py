"""`modgate quality report` reaches Redis the way `modgate serve` does, through Sentinel included."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.cluster import SentinelFleet, running
from cli.quality import quality_app
from contracts.records import RedisRecordStore
from gateway.state import open_redis
from quality.report import WeeklyReport
from tests.quality.fakes import synthesize_week


def write_week_to_redis(url: str, year: int, week: int) -> int:
    """A synthetic week appended to the records stream at ``url`` (read by stream time: this week's)."""

    async def write() -> int:
        client = open_redis(url)
        try:
            store = RedisRecordStore(client)
            records = synthesize_week(year=year, week=week, frames=400, videos=40, seed=5).records
            for record in records:
                await store.append(record)
            return len(records)
        finally:
            await client.aclose()

    return asyncio.run(write())


@pytest.mark.redis
def test_the_weekly_report_reads_its_records_through_sentinel(tmp_path: Path) -> None:
    year, week, _ = datetime.now(UTC).isocalendar()
    label = f"{year}-W{week:02d}"
    fleet = SentinelFleet(tmp_path / "redis", replicas=1, sentinels=1).start()
    with running(fleet):
        written = write_week_to_redis(fleet.url, year, week)
        result = CliRunner().invoke(
            quality_app,
            ["report", "--week", label, "--redis-url", fleet.url, "--out", str(tmp_path / "out"),
             "--bootstrap", "200", "--trend-weeks", "0"],
        )

    assert result.exit_code == 0, f"{result.output}{result.exception!r}"
    report = WeeklyReport.model_validate_json((tmp_path / "out" / f"quality-{label}.json").read_text())
    assert report.comparison is not None
    assert 0 < report.comparison.frames <= written


def test_a_redis_url_the_gateway_would_refuse_is_refused_with_its_reason(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        quality_app,
        ["report", "--week", "2026-W48", "--redis-url", "redis+sentinel://h/modgate", "--out", str(tmp_path)],
    )

    assert result.exit_code == 2
    assert "HOST:PORT" in result.output
