"""The decision log: every answered verdict on Redis, moved by age to daily Parquet, exported."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app
from contracts.decisions import (
    DecisionRow,
    day_partitions,
    drop_days_before,
    read_decisions,
    tenant_decisions,
    write_day_partitions,
)
from deploy.keyframes import make_keyframe
from gateway.decisions.log import RedisDecisionLog
from gateway.decisions.rows import label_row
from gateway.http.services import redis_client
from gateway.settings import DecisionSettings
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEYS = "k-news-0123:news,k-kids-0123:kids"
FRAMES = [make_keyframe("block:violence", 320, 180, seed=11), make_keyframe("allow", 320, 180, seed=12)]
# what each row says, and where the answer's modgate field says it
SAME_AS_ANSWER = [
    "frame_sha256", "action", "categories", "confidence", "model", "model_revision", "prompt_version",
    "prompt_sha256", "moderation_policy_version", "thinking", "thinking_mode", "thinking_rule",
    "model_action", "moderation_rule", "latency_ms",
]


def moderate(url: str, key: str, frames: list[bytes]) -> dict[str, Any]:
    """One moderation answer (JSON)."""
    response = httpx.post(f"{url}/v1/moderations", json={"model": "m", "input": image_input(*frames)},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def expected_rows(answer: dict[str, Any], tenant: str) -> list[dict[str, Any]]:
    """What the log must hold for each result of ``answer``."""
    rows = []
    for result in answer["results"]:
        details = result["modgate"]
        kind = "reused" if details["reused"] else "escalated" if details["escalated_from"] else "judged"
        rows.append({"request_id": answer["id"], "tenant": tenant, "kind": kind, "automated": True,
                     "engine_request_id": details["request_id"],
                     **{name: details[name] for name in SAME_AS_ANSWER}})
    return rows


def exported(runner: CliRunner, out: Path, out_format: str, **options: str) -> list[dict[str, Any]]:
    """``modgate decisions export`` to ``out``, read back as dicts."""
    args = ["decisions", "export", "--format", out_format, "--out", str(out)]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", value]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    if out_format == "parquet":
        table = pq.read_table(out)
        return [DecisionRow.model_validate(row).model_dump(mode="json") for row in table.to_pylist()]
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("out_format", ["jsonl", "parquet"])
def test_a_day_of_decisions_is_exported_field_by_field(
    start_gateway: GatewayFactory, sim: ThreadedServer, redis_url: str, tmp_path: Path, out_format: str
) -> None:
    archive = tmp_path / "decisions"
    settings = {"archive_dir": str(archive), "stream": "test:decisions"}
    gateway = start_gateway(engine_url=sim.url, api_keys=KEYS, redis_url=redis_url, decisions=settings)
    started = datetime.now(UTC) - timedelta(seconds=1)
    policy = {"tenants": {"news": {"categories": ["sexual"]}}, "reason": "news clips show violence"}
    put = httpx.put(f"{gateway.url}/admin/moderation-policy", json=policy, headers=ADMIN, timeout=10)
    assert put.status_code == 200, put.text
    answers = [(moderate(gateway.url, "k-news-0123", FRAMES), "news"),
               (moderate(gateway.url, "k-kids-0123", FRAMES), "kids")]

    async def move_to_parquet() -> int:  # what the gateway's archiver does every archive_interval_s
        client = redis_client(redis_url)
        try:
            log = RedisDecisionLog(client, DecisionSettings(archive_after_s=0, **settings))  # type: ignore[arg-type]  # the settings dict holds str values for Path fields
            return await log.archive()
        finally:
            await client.aclose()

    assert asyncio.run(move_to_parquet()) == 4
    assert list(day_partitions(archive)) == [datetime.now(UTC).date()]
    answers.append((moderate(gateway.url, "k-kids-0123", FRAMES), "kids"))  # reused: still on the stream
    expected = [row for answer, tenant in answers for row in expected_rows(answer, tenant)]
    assert [row["kind"] for row in expected] == ["judged"] * 4 + ["reused"] * 2
    assert expected[0]["action"] == "allow"  # the news tenant enforces no violence
    assert expected[0]["model_action"] == "block"

    runner = CliRunner()
    common = {"since": started.isoformat(), "redis_url": redis_url, "archive_dir": str(archive),
              "stream": "test:decisions"}
    rows = exported(runner, tmp_path / f"all.{out_format}", out_format, **common)
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        for field, value in want.items():
            assert row[field] == value, (field, row, want)
        assert started <= datetime.fromisoformat(row["decided_at"]) <= datetime.now(UTC)
        assert row["labelled_by"] is None
    kids = exported(runner, tmp_path / f"kids.{out_format}", out_format, tenant="kids", **common)
    assert [row["request_id"] for row in kids] == [row["request_id"] for row in expected[2:]]
    later = exported(runner, tmp_path / f"later.{out_format}", out_format,
                     **{**common, "since": (datetime.now(UTC) + timedelta(minutes=1)).isoformat()})
    assert later == []


def row(at: datetime, tenant: str = "t") -> DecisionRow:
    return DecisionRow(
        decided_at=at, request_id=f"modr-{at.timestamp():.0f}", tenant=tenant, frame_sha256="a" * 64,
        kind="judged", automated=True, action="block", categories=["violence"], confidence=0.9, model="m",
        prompt_version="v2", moderation_policy_version=3, thinking="off",
    )


def test_days_are_kept_apart_read_in_order_and_dropped_after_retention(tmp_path: Path) -> None:
    now = datetime(2026, 12, 3, 12, tzinfo=UTC)
    rows = [row(now - timedelta(days=days, hours=1)) for days in (40, 2, 0)]
    write_day_partitions(rows, tmp_path)
    assert [day.isoformat() for day in day_partitions(tmp_path)] == ["2026-10-24", "2026-12-01", "2026-12-03"]
    assert list(read_decisions(tmp_path, now - timedelta(days=3))) == rows[1:]
    assert drop_days_before(tmp_path, keep_days=30, now=now) == [rows[0].decided_at.date()]
    assert list(read_decisions(tmp_path, now - timedelta(days=400))) == rows[1:]


def test_a_human_label_is_a_row_of_its_own_that_is_not_automated() -> None:
    decided = row(datetime(2026, 12, 3, tzinfo=UTC))
    labelled = label_row(decided.request_id, decided.tenant, decided.frame_sha256, "allow", [], "reviewer-7",
                         datetime(2026, 12, 3, 1, tzinfo=UTC))
    assert (labelled.kind, labelled.automated, labelled.action, labelled.labelled_by) == (
        "label", False, "allow", "reviewer-7"
    )
    assert (labelled.request_id, labelled.frame_sha256, labelled.tenant) == (
        decided.request_id, decided.frame_sha256, decided.tenant
    )


def test_each_tenants_block_share_and_label_agreement_come_from_the_log(tmp_path: Path) -> None:
    at = datetime(2026, 12, 3, 9, tzinfo=UTC)
    news = [row(at + timedelta(minutes=i), tenant="news") for i in range(4)]
    news[0] = news[0].model_copy(update={"action": "allow", "model_action": "block",
                                         "moderation_rule": "category_not_enforced"})
    news[1] = news[1].model_copy(update={"action": "review", "kind": "engine_failure"})
    kids = [row(at + timedelta(minutes=10), tenant="kids")]
    later = at + timedelta(hours=1)
    labels = [  # a person agrees with one block of news and overturns the other, and agrees with kids'
        label_row(news[2].request_id, "news", news[2].frame_sha256, "block", ["violence"], "r1", later),
        label_row(news[3].request_id, "news", news[3].frame_sha256, "allow", [], "r1", later),
        label_row(kids[0].request_id, "kids", kids[0].frame_sha256, "block", ["violence"], "r2", later),
    ]
    figures = {f.tenant: f for f in tenant_decisions([*news, *kids, *labels])}
    assert (figures["news"].decisions, figures["news"].block_share) == (4, 0.5)
    assert figures["news"].review_share == 0.25
    assert (figures["news"].changed_by_policy, figures["news"].engine_failures) == (1, 1)
    assert (figures["news"].labelled, figures["news"].label_agreement) == (2, 0.5)
    assert (figures["kids"].decisions, figures["kids"].label_agreement) == (1, 1.0)

    write_day_partitions([*news, *kids, *labels], tmp_path)
    args = ["decisions", "summary", "--since", "2026-12-03", "--archive-dir", str(tmp_path)]
    shown = CliRunner().invoke(app, args, env={"MODGATE_REDIS__URL": ""})  # the archive alone
    assert shown.exit_code == 0, shown.output
    news_line = next(line for line in shown.output.splitlines() if "news" in line)
    assert "50.0 %" in news_line
    assert "25.0 %" in news_line
