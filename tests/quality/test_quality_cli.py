"""`modgate quality run|report` as an operator types them."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.quality import previous_week, quality_app, resolve_week
from contracts.records import JsonlRecordStore, pair_records
from deploy.keyframes import LABELS, make_keyframe
from quality.report import WeeklyReport
from tests.quality.fakes import synthesize_week

runner = CliRunner()


def write_week(directory: Path, **changes: object) -> None:
    async def write() -> None:
        store = JsonlRecordStore(directory)
        for record in synthesize_week(**changes).records:  # type: ignore[arg-type]  # its own keywords
            await store.append(record)
        await store.aclose()

    asyncio.run(write())


def test_report_writes_html_markdown_and_json_and_prints_the_recommendation(tmp_path: Path) -> None:
    write_week(tmp_path / "records", frames=1200, videos=120, seed=31)
    write_week(tmp_path / "records", frames=1000, videos=100, seed=30, week=47)
    result = runner.invoke(
        quality_app,
        [
            "report",
            "--week",
            "2026-W48",
            "--records",
            str(tmp_path / "records"),
            "--out",
            str(tmp_path / "out"),
            "--bootstrap",
            "300",
            "--min-agreement",
            "0.95",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "2026-W48 ·" in result.output
    assert "Thinking off agrees" in result.output
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["quality-2026-W48.html", "quality-2026-W48.json", "quality-2026-W48.md"]
    report = WeeklyReport.model_validate_json((tmp_path / "out" / "quality-2026-W48.json").read_text())
    assert report.policy.min_agreement == 0.95
    assert [s.week for s in report.trend] == ["2026-W47", "2026-W48"]  # W47 recomputed from its records


def test_report_on_an_empty_week_explains_instead_of_failing(tmp_path: Path) -> None:
    result = runner.invoke(
        quality_app,
        ["report", "--week", "2026-W10", "--records", str(tmp_path), "--out", str(tmp_path / "out")],
    )
    assert result.exit_code == 0, result.output
    assert "No quality records for 2026-W10" in result.output


def test_report_refuses_a_malformed_week(tmp_path: Path) -> None:
    result = runner.invoke(quality_app, ["report", "--week", "2026-48", "--records", str(tmp_path)])
    assert result.exit_code == 2
    assert "expected an ISO week like 2026-W48" in result.output


def test_last_week_is_the_previous_complete_iso_week() -> None:
    monday_morning = datetime(2026, 11, 30, 6, 15, tzinfo=UTC)  # first day of W49
    assert previous_week(monday_morning) == "2026-W48"
    assert resolve_week("last", monday_morning) == "2026-W48"
    assert resolve_week("2027-w1") == "2027-W01"
    assert previous_week(datetime(2027, 1, 4, tzinfo=UTC)) == "2026-W53"


def test_run_refuses_an_unknown_arm_before_sending_anything(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(make_keyframe("allow", 320, 180))
    result = runner.invoke(quality_app, ["run", str(tmp_path), "--arms", "thinking_on,fast"])
    assert result.exit_code == 2
    assert "unknown arm 'fast'" in result.output


def test_run_then_report_against_the_real_gateway(tmp_path: Path, gateway: ThreadedServer) -> None:
    """Keyframes through the gateway (instant simulator behind it) under both arms, then the report."""
    dataset = tmp_path / "frames"
    manifest = ["path,video_id,label"]
    for index in range(8):
        label = LABELS[index % len(LABELS)]
        name = f"clip-{index % 2}/{index:03d}.jpg"
        (dataset / name).parent.mkdir(parents=True, exist_ok=True)
        (dataset / name).write_bytes(make_keyframe(label, 320, 180, seed=index))
        manifest.append(f"{name},clip-{index % 2},{'allow' if label == 'allow' else 'block'}")
    (dataset / "manifest.csv").write_text("\n".join(manifest) + "\n")
    records = tmp_path / "records"

    result = runner.invoke(
        quality_app,
        [
            "run",
            str(dataset / "manifest.csv"),
            "--arms",
            "thinking_on,thinking_off",
            "--gateway-url",
            gateway.url,
            "--out",
            str(records),
            "--concurrency",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "recorded 16 verdicts" in result.output

    again = runner.invoke(
        quality_app,
        ["run", str(dataset / "manifest.csv"), "--gateway-url", gateway.url, "--out", str(records)],
    )
    assert again.exit_code == 0, again.output
    assert "recorded 0 verdicts" in again.output
    assert "skipped 16 already recorded" in again.output

    stored = asyncio.run(JsonlRecordStore(records).read_range(None, None))
    assert len(pair_records(stored).pairs) == 8
    assert all(r.human_label is not None for r in stored)
    assert {r.video_id for r in stored} == {"clip-0", "clip-1"}

    week = resolve_week("current")
    report = runner.invoke(
        quality_app,
        [
            "report",
            "--week",
            week,
            "--records",
            str(records),
            "--out",
            str(tmp_path / "out"),
            "--bootstrap",
            "200",
        ],
    )
    assert report.exit_code == 0, report.output
    data = json.loads((tmp_path / "out" / f"quality-{week}.json").read_text())
    assert data["comparison"]["frames"] == 8
    assert data["recommendation"]["decision"] in ("thinking_off_ok", "keep_thinking_on", "inconclusive")


def test_convert_writes_each_jsonl_week_as_parquet_and_the_report_reads_it(tmp_path: Path) -> None:
    records = tmp_path / "records"
    write_week(records, frames=600, videos=60, seed=12)
    converted = runner.invoke(quality_app, ["convert", "--records", str(records)])
    assert converted.exit_code == 0, converted.output
    assert "2026-W48: 1,200 records" in converted.output
    assert list((records / "week=2026-W48").glob("part-*.parquet"))
    again = runner.invoke(quality_app, ["convert", "--records", str(records)])
    assert "nothing to convert" in again.output

    outputs = {}
    for name, folder in (("parquet", records), ("jsonl", tmp_path / "jsonl-only")):
        if name == "jsonl":
            write_week(folder, frames=600, videos=60, seed=12)
        result = runner.invoke(
            quality_app,
            [
                *("report", "--week", "2026-W48", "--records", str(folder), "--out", str(tmp_path / name)),
                *("--bootstrap", "200", "--trend-weeks", "0"),
            ],
        )
        assert result.exit_code == 0, result.output
        data = json.loads((tmp_path / name / "quality-2026-W48.json").read_text())
        data.pop("generated_at")
        outputs[name] = data
    assert outputs["parquet"] == outputs["jsonl"]
    assert outputs["parquet"]["comparison"]["frames"] == 600
